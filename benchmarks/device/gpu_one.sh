# One H100, one call: the rollout engine (groups of 8; compiled step or not; fused attention kernels or plain)
# beside transformers generate with the one-command loop's step split, then (TRAIN=1) the trainer (defaults vs
# 8k micro-batches, mixed and equal) beside Atropos' example trainer.
source benchmarks/device/setup.sh
timeout ${GEN_TIMEOUT:-330} python3 benchmarks/bench_generation.py --out "$OUT/generation.md" \
  --batches ${GEN_BATCHES:-64,512} --variants ${GEN_VARIANTS:-8:1} --old-loop-batches none \
  --loop-steps ${LOOP_STEPS:-5} ${GEN_ARGS:-} 2>&1 \
  | grep -v "Warning\|warn\|shards" | tee "$OUT/gen.log"
[ "${TRAIN:-1}" = 1 ] || exit 0
TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 timeout ${TRAIN_TIMEOUT:-240} python3 \
  benchmarks/bench_trainer.py --steps 4 --warmup 1 --lengths mixed,equal --no-grad-check \
  --ours-mixed "a:0:a:auto:a,8192:0:a:auto:a" --ours-equal "a:0:a:auto:a,8192:0:a:auto:a" --atropos 32:1 \
  --out "$OUT/trainer.md" 2>&1 | grep -v "Warning\|warn\|DEBUG" | tee "$OUT/trainer.log"
