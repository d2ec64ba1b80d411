# One H100, one call (under 4 minutes) (issue 23, session 9, call 8): the trainer's default micro-batch (16k
# tokens on one GPU) against 32k, mixed and equal lengths, with this session's pinned-memory copies (Must 1).
source benchmarks/device/setup.sh
TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 timeout 200 python3 benchmarks/bench_trainer.py \
  --steps 5 --warmup 2 --lengths mixed,equal --no-grad-check --ours-mixed "a:0:a:auto:a,32768:0:a:auto:a" \
  --ours-equal "a:0:a:auto:a,32768:0:a:auto:a" --atropos "" --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1
cat "$OUT/trainer.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/trainer.log" | tail -20
