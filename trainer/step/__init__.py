"""The step: one GRPO-family optimizer step on one process, from scored groups to updated weights.

Owns the algorithm and its numerics: advantages and micro-batches (`batching.py`), the transformer body and
its compiled attention (`attention.py`), chunked fp32 log-probs (`logprobs.py`), the loss family
(`losses.py`), weights and optimizer precision (`precision.py`), the step loop itself (`grpo.py`) and the
numbers each step reports (`metrics.py`). Spreading the step over ranks is `scale/`'s job.
"""
