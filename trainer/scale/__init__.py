"""Scale: the step over many GPUs (`atropos train --nproc-per-node N`).

Owns the process group and how a step's groups are split between ranks (`distributed.py`), the two ways of
training on many ranks: FSDP2 sharding and its optimizer (`fsdp.py`) or whole-model replicas whose gradients
are summed once a step (`replicate.py`, the default for small models on CUDA), resumable sharded checkpoints
(`sharded_checkpoint.py`) and starting the ranks through torchrun (`launch.py`). The step itself (`step/`)
does not change with the world size.
"""
