"""The bundled trainer package (imported as `atropos_cli.trainer` by `atropos train`; needs torch).

Grouped by stage; read in this order:
- `step/`: one optimizer step on one process: `grpo.py` (the GRPO step and loop), `losses.py` (the loss
  family), `logprobs.py` (chunked fp32 log-probs, fused chunk kernels on CUDA), `batching.py` (groups ->
  padded or packed micro-batches), `attention.py` (compiling without losing the causal flash path),
  `precision.py` (fp32 master weights), `metrics.py` (a step's numbers and where they go);
- `scale/`: the same step over many GPUs: `distributed.py` (the process group), `fsdp.py` (FSDP2 sharding),
  `sharded_checkpoint.py` (DCP checkpoints), `launch.py` (`--nproc-per-node` through torchrun);
- `weights/`: the trained weights on their way out: `lora.py` (peft adapters, merged weights), `sync.py`
  (after-step sync into the engine), `vllm.py` + `vllm_endpoints.py` (a vLLM server), `vllm_colocate.py`
  (vLLM in-process), `weight_push.py` + `versioned_engine.py` (trainer ranks -> engine ranks);
- `data/`: where batches come from: `sources.py` (files, trajectory API), `rollouts.py` (in-process env workers).

Here, the wiring and the whole run: `config.py` (the settings), `run.py` (one run), `async_loop.py` (the
disaggregated loop of `--inference-gpus`), `checkpoint.py` (HF checkpoints, resume), `plot.py` (`--plot`).
SFT lives in `sft.py`; `tiny_model.py` builds the shipped tiny model's starting point.
"""
