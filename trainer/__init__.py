"""The bundled trainer package (imported as `atropos_cli.trainer` by `atropos train`; needs torch).

Read in this order: `grpo.py` (the GRPO step and loop), `losses.py` (the loss family), `logprobs.py` (chunked
fp32 log-probs, fused chunk kernels on CUDA), `batching.py` (groups -> padded or packed micro-batches),
`precision.py` (fp32 master weights), `attention.py` (compiling without losing the causal flash path),
`lora.py` (peft adapters), then the wiring: `run.py` (one run), `sources.py` (files, trajectory API),
`rollouts.py` (in-process env workers), `sync.py` / `vllm.py` + `vllm_endpoints.py` (weight sync),
`checkpoint.py`, `metrics.py`, `plot.py`. SFT lives in `sft.py`.
"""
