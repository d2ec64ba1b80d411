# Issue 23 Must 3 on one GPU (the caller sources setup.sh and picks the GPU): the rollout engine's decode
# attention, torch's fused kernel per block (f, the default) against the opt-in Triton decode kernel (t), compiled
# step, groups of 8, at batch 512 then 64, transformers generate beside them; the logprob contract checked with the
# Triton kernel. A variant the GPU refuses reports its first error line and the rest still run.
python3 benchmarks/bench_generation.py --batches "${GEN_BATCHES:-512,64}" --variants "${GEN_VARIANTS:-8:1:f,8:1:t}" \
  --contract-attention t --old-loop-batches none --no-loop --out "$OUT/generation.md"
