# One 4-GPU host, one call (under 9.5 minutes): issue 24 Must 5's arithmetic rows, then single-GPU rows on the
# freed GPUs. GPUs 0-1: the shipped tiny model (it learns: the reward curves) on arithmetic, the colocated sync
# loop vs async 1 (1 trainer + 1 engine GPU); then GPU 0 runs the engine benchmark (gen_engine.sh: the Triton decode
# kernel vs torch's fused kernel) and GPU 1 the one-command loop split (5 steps, 0.5B shape). GPUs 2-3: the 0.5B
# shape on arithmetic, sync vs async 1 (steps/s). Every part has its own time limit; each keeps what it finished.
source benchmarks/device/setup.sh
(
  CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/bench_async.py --models tiny --envs arithmetic --modes "sync,async 1" \
    --steps "${TINY_STEPS:-30}" --warmup 3 --groups 32 --timeout "${TINY_TIMEOUT:-130}" \
    --out "$OUT/async_tiny.md" > "$OUT/async_tiny.log" 2>&1
  (CUDA_VISIBLE_DEVICES=0 timeout "${GEN_TIMEOUT:-290}" bash benchmarks/device/gen_engine.sh > "$OUT/gen.log" 2>&1) &
  (CUDA_VISIBLE_DEVICES=1 timeout "${LOOP_TIMEOUT:-290}" python3 benchmarks/bench_generation.py --loop-only \
    --loop-steps "${LOOP_STEPS:-6}" --loop-timeout $(( ${LOOP_TIMEOUT:-290} - 30 )) --out "$OUT/loop_split.md" \
    > "$OUT/loop.log" 2>&1) &
  wait
) &
CUDA_VISIBLE_DEVICES=2,3 python3 benchmarks/bench_async.py --models 0.5b --envs arithmetic --modes "sync,async 1" \
  --steps "${STEPS:-8}" --warmup 2 --groups 32 --timeout "${TIMEOUT:-220}" \
  --out "$OUT/async_05b.md" > "$OUT/async_05b.log" 2>&1 &
wait
grep -h '^{"mode"' "$OUT"/async_*.log
grep -h "^|\|^- " "$OUT/generation.md" "$OUT/loop_split.md" 2>/dev/null | grep -v "^| [0-9]* | 0\.[0-9]* |$"
