"""Weights: the trained weights on their way out of the trainer, into the engines that sample from them.

Owns LoRA adapters and the merged weights that leave a LoRA run (`lora.py`), the after-step sync into the
local engine or an external server (`sync.py`), a vLLM server we launch and its reload endpoints (`vllm.py`,
`vllm_endpoints.py`), vLLM inside the trainer's process (`vllm_colocate.py`), and the disaggregated path:
trainer ranks push buckets to engine ranks (`weight_push.py`) whose engine swaps them in and tags every token
with its policy version (`versioned_engine.py`).
"""
