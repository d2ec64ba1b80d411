# The async measurement (issue 24, Must 5) on a 2-GPU host: a short smoke row first (stop early if it fails), then
# sync vs async S=0 / S=1 on the arithmetic env and the longer-generation count env. One model per call (a call
# has 10 minutes): MODELS=0.5b (the 0.5B shape, random weights: throughput) then MODELS=tiny (the shipped model,
# which learns: the reward curves). STEPS, NGROUPS and LONG (the count env's token budget) scale the run.
source benchmarks/device/setup.sh
MODELS="${MODELS:-0.5b}"
python3 benchmarks/bench_async.py --models tiny --envs arithmetic --modes "async 1" --steps 2 --warmup 0 \
  --groups 4 --timeout 120 > "$OUT/smoke.log" 2>&1
tail -5 "$OUT/smoke.log"
grep -q '"error"' "$OUT/smoke.log" && exit 1
python3 benchmarks/bench_async.py --models "$MODELS" --steps "${STEPS:-12}" --warmup 2 --groups "${NGROUPS:-32}" \
  --long-tokens "${LONG:-512}" --timeout 240 --out "$OUT/async_$MODELS.md" 2>&1 | tee "$OUT/async_$MODELS.log"
