# One 4-GPU host, one call (under 9.5 minutes): issue 23 Musts 1, 3 and 4, each on a GPU of its own.
# 1. The trainer alone on GPU 0 (its step is host-bound, so nothing runs beside it): the defaults with the
#    compiled layers' CUDA graphs off (G) and on (g), mixed then equal lengths, beside Atropos' example trainer,
#    inductor caches off (every row's first step is a cold compile).
# 2. Then side by side: the engine's decode attention, fused against Triton (gen_engine.sh, GPU 1), and the
#    one-command loop's step split (loop_split.sh, GPU 2).
source benchmarks/device/setup.sh
CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 timeout ${TRAIN_TIMEOUT:-250} \
  python3 benchmarks/bench_trainer.py --steps ${TRAIN_STEPS:-6} --warmup ${TRAIN_WARMUP:-3} --lengths mixed,equal \
  --no-grad-check --ours-mixed "${MIXED:-a:0:a:auto:a:-:0:G,a:0:a:auto:a:-:0:g}" \
  --ours-equal "${EQUAL:-a:0:a:auto:a:-:0:G,a:0:a:auto:a:-:0:g}" --atropos "${ATROPOS:-32:1}" \
  --out "$OUT/trainer.md" 2>&1 | grep -v "Warning\|warn\|DEBUG" | tee "$OUT/trainer.log" | grep -v "^ \|^Traceback"
[ "${ONLY_TRAIN:-0}" = 1 ] && exit 0
(CUDA_VISIBLE_DEVICES=1 timeout ${GEN_TIMEOUT:-320} bash benchmarks/device/gen_engine.sh > "$OUT/gen.log" 2>&1) &
CUDA_VISIBLE_DEVICES=2 LOOP_STEPS=${LOOP_STEPS:-6} LOOP_TIMEOUT=${LOOP_TIMEOUT:-300} bash benchmarks/device/loop_split.sh \
  > /dev/null 2>&1
wait
echo "== loop"; cat "$OUT/loop_split.md" 2>/dev/null || tail -20 "$OUT/loop.log"
echo "== engine"; cat "$OUT/generation.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/gen.log" | tail -30
