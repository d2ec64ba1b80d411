"""The bundled trainer package (imported as `atropos_trainer` by `atropos train`; needs torch).

Read in this order: `grpo.py` (the GRPO step and loop), `losses.py` (the loss family), `logprobs.py` (chunked
fp32 log-probs), `batching.py` (groups -> tensors), `precision.py` (fp32 master weights), then the wiring:
`run.py` (one run), `sources.py` (files, trajectory API), `rollouts.py` (in-process env workers), `sync.py` /
`vllm.py` (weight sync), `checkpoint.py`, `metrics.py`, `plot.py`. SFT lives in `sft.py`.
"""
