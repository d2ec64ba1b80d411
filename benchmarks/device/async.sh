# The async measurement (issue 24, Must 5) on a 2-GPU host: a short smoke row first (stop early if it fails), then
# sync vs async S=0 / S=1 on the 0.5B shape (throughput) and the shipped tiny model (the reward curve), on the
# arithmetic env and the longer-generation count env.
source benchmarks/device/setup.sh
python3 benchmarks/bench_async.py --models tiny --envs arithmetic --modes "async 1" --steps 2 --warmup 0 \
  --groups 4 2>&1 | tail -3 | tee "$OUT/smoke.log"
grep -q "failed" "$OUT/smoke.log" && exit 1
python3 benchmarks/bench_async.py --steps "${STEPS:-30}" --out "$OUT/async_gpu.md" 2>&1 | tee "$OUT/async.log"
