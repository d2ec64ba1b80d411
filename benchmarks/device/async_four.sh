# Issue 24 Must 5 on one 4-GPU host in one call: GPUs 0-1 the shipped tiny model (it learns: the reward curves of the
# colocated sync loop vs async 1), GPUs 2-3 the 0.5B shape (steps/s), side by side. A row past its limit keeps the
# steps it made (bench_async marks it). TINY_ENVS / ENVS pick the envs (arithmetic, count: the longer-generation
# env). PROFILE_15B=1: once the tiny rows are done, GPU 0 profiles one step of the one-process 1.5B trainer
# (bench_fsdp's plain:1.5b:prof, the CPU and CUDA kernel tables).
source benchmarks/device/setup.sh
nvidia-smi topo -m | head -6
(
  CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/bench_async.py --models tiny --envs "${TINY_ENVS:-arithmetic,count}" \
    --modes "sync,async 1" --steps "${TINY_STEPS:-40}" --warmup 3 --groups 32 --long-tokens 256 \
    --timeout "${TINY_TIMEOUT:-105}" --out "$OUT/async_tiny.md" > "$OUT/async_tiny.log" 2>&1
  if [ "${PROFILE_15B:-0}" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/bench_fsdp.py --steps 2 --warmup 2 --row-timeout 180 \
      --rows plain:prof,plain:1.5b:prof --out "$OUT/prof_15b.md" > "$OUT/prof_15b.log" 2>&1
  fi
) &
CUDA_VISIBLE_DEVICES=2,3 python3 benchmarks/bench_async.py --models 0.5b --envs "${ENVS:-count}" --modes "sync,async 1" \
  --steps "${STEPS:-8}" --warmup 2 --groups 32 --long-tokens "${LONG:-384}" --timeout "${TIMEOUT:-200}" \
  --out "$OUT/async_05b.md" > "$OUT/async_05b.log" 2>&1 &
wait
grep -h '^{"mode"' "$OUT"/async_*.log
