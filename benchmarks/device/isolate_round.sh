# One H100, one call (under 9 minutes): the trainer's defaults, mixed and equal lengths, each row in 3 fresh
# processes (bench_trainer.py --isolate: median and range), then Atropos' example_trainer on the same machine
# (issue 23, Must 1 and 5). Session 10 found a process's first trainer row up to ~8% slower than a later row of
# the same code and fresh processes spreading up to ~10%: compare settings only with --isolate. Extra rows: MIXED=...
# EQUAL=... (bench_trainer.parse_variant specs, comma-separated).
source benchmarks/device/setup.sh
export TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
D=a:0:a:auto:a
timeout 400 python3 benchmarks/bench_trainer.py --isolate --repeat "${REPEAT:-3}" --steps 9 --warmup 3 \
  --lengths mixed,equal --no-grad-check --ours-mixed "${MIXED:-$D}" --ours-equal "${EQUAL:-$D}" --atropos "" \
  --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1
cat "$OUT/trainer.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/trainer.log" | tail -30
grep "^  ours" "$OUT/trainer.log"  # each run's tokens/s and timed step times
timeout 120 python3 benchmarks/bench_trainer.py --steps 9 --warmup 3 --lengths mixed,equal --no-grad-check \
  --ours-mixed "" --ours-equal "" --atropos 32:1 --out "$OUT/atropos.md" > "$OUT/atropos.log" 2>&1
grep "^| Atropos" "$OUT/atropos.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/atropos.log" | tail -10
