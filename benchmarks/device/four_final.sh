# One 4-GPU host, one call (under 9.7 minutes), everything side by side with its own time limit (each part keeps
# what it finished):
#   GPUs 0-1: issue 24, the shipped tiny model on arithmetic, sync vs async 1 (the reward curves); then issue 23
#     Must 2, bench_fsdp's one-process 0.5B row and 2 ranks at the defaults (replicate, the gradient sum overlapped
#     with the last backward), per-rank detail; then the one-process 1.5B row with expandable segments.
#   GPUs 2-3: issue 24, the 0.5B shape on arithmetic, sync vs async 1 (steps/s); then GPU 2 the one-command loop
#     split (issue 23 Must 4) and GPU 3 the engine at batch 512, fused vs the opt-in Triton kernel (Must 3).
# The parts share the host (64 cores): the bench_fsdp rows run beside the GPU 2-3 jobs, their plain row too.
source benchmarks/device/setup.sh
(
  CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/bench_async.py --models tiny --envs arithmetic --modes "sync,async 1" \
    --steps "${TINY_STEPS:-25}" --warmup 3 --groups 32 --timeout "${TINY_TIMEOUT:-105}" \
    --out "$OUT/async_tiny.md" > "$OUT/async_tiny.log" 2>&1
  CUDA_VISIBLE_DEVICES=0,1 timeout "${FSDP_TIMEOUT:-300}" python3 benchmarks/bench_fsdp.py --steps 3 --warmup 2 \
    --row-timeout 95 --logs "$OUT/rows" --rows "${FSDP_ROWS:-plain:detail,0.5b:2:detail,plain:1.5b:exp}" \
    --out "$OUT/fsdp.md" > "$OUT/fsdp.log" 2>&1
) &
(
  CUDA_VISIBLE_DEVICES=2,3 python3 benchmarks/bench_async.py --models 0.5b --envs arithmetic --modes "sync,async 1" \
    --steps "${STEPS:-6}" --warmup 2 --groups 32 --timeout "${TIMEOUT:-150}" \
    --out "$OUT/async_05b.md" > "$OUT/async_05b.log" 2>&1
  (CUDA_VISIBLE_DEVICES=2 timeout "${LOOP_TIMEOUT:-230}" python3 benchmarks/bench_generation.py --loop-only \
    --loop-steps "${LOOP_STEPS:-6}" --loop-timeout $(( ${LOOP_TIMEOUT:-230} - 20 )) --out "$OUT/loop_split.md" \
    > "$OUT/loop.log" 2>&1) &
  (CUDA_VISIBLE_DEVICES=3 GEN_BATCHES="${GEN_BATCHES:-512}" timeout "${GEN_TIMEOUT:-250}" \
    bash benchmarks/device/gen_engine.sh > "$OUT/gen.log" 2>&1) &
  wait
) &
wait
grep -h '^{"mode"' "$OUT"/async_*.log
grep -h "^| \|^- " "$OUT/fsdp.log" "$OUT/gen.log" "$OUT/loop_split.md" 2>/dev/null | cut -c1-400 | head -60
