# Issue 24 Must 5 on one 4-GPU host in one call: GPUs 0-1 the shipped tiny model (it learns: the reward curves of the
# colocated sync loop vs async 1, arithmetic then count), GPUs 2-3 the 0.5B shape on the longer-generation count
# env (steps/s). A row past its limit keeps the steps it made (bench_async marks it).
source benchmarks/device/setup.sh
nvidia-smi topo -m | head -6
CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/bench_async.py --models tiny --modes "sync,async 1" \
  --steps "${TINY_STEPS:-40}" --warmup 3 --groups 32 --long-tokens 256 --timeout "${TINY_TIMEOUT:-105}" \
  --out "$OUT/async_tiny.md" > "$OUT/async_tiny.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 python3 benchmarks/bench_async.py --models 0.5b --envs count --modes "sync,async 1" \
  --steps "${STEPS:-8}" --warmup 2 --groups 32 --long-tokens "${LONG:-384}" --timeout "${TIMEOUT:-200}" \
  --out "$OUT/async_05b.md" > "$OUT/async_05b.log" 2>&1 &
wait
grep -h '^{"mode"' "$OUT"/async_*.log
