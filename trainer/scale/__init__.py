"""Scale: the step over many GPUs (`atropos train --nproc-per-node N`).

Owns the process group and how a step's groups are split between ranks (`distributed.py`), FSDP2 sharding
and its optimizer (`fsdp.py`), resumable sharded checkpoints (`sharded_checkpoint.py`) and starting the
ranks through torchrun (`launch.py`). The step itself (`step/`) does not change with the world size.
"""
