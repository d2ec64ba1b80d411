# One H100, one call: CUDA graphs of whole micro-batches (issue 23, Must 1). First the numerics check against
# eager steps (check_graphs.py), then the defaults (graphs) against knob g (no graphs), mixed and equal lengths,
# each row in fresh processes (REPEAT, default 2; WARMUP and STEPS: 3 and 9). ATROPOS=1 adds Atropos' example_trainer in the same call.
source benchmarks/device/setup.sh
export TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
if [ "${CHECK:-1}" = 1 ]; then
  timeout 240 python3 benchmarks/check_graphs.py --steps "${CHECK_STEPS:-5}" > "$OUT/check.md" 2> "$OUT/check.err"
  echo "check rc=$?"; cat "$OUT/check.md"; grep -v "^W1\|warn" "$OUT/check.err" | tail -8
fi
D=a:0:a:auto:a
timeout "${BENCH_S:-420}" python3 benchmarks/bench_trainer.py --isolate --repeat "${REPEAT:-2}" --steps "${STEPS:-9}" --warmup "${WARMUP:-3}" \
  --lengths "${LENGTHS:-mixed,equal}" --no-grad-check --ours-mixed "${MIXED:-$D,$D:-:0:g}" \
  --ours-equal "${EQUAL:-$D,$D:-:0:g}" --atropos "" --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1
cat "$OUT/trainer.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/trainer.log" | tail -30
grep "^  ours\|CUDA graphs\|Error\|error" "$OUT/trainer.log" | head -40
if [ "${ATROPOS:-0}" = 1 ]; then
  timeout 120 python3 benchmarks/bench_trainer.py --steps 9 --warmup 3 --lengths mixed,equal --no-grad-check \
    --ours-mixed "" --ours-equal "" --atropos 32:1 --out "$OUT/atropos.md" > "$OUT/atropos.log" 2>&1
  grep "^| Atropos" "$OUT/atropos.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/atropos.log" | tail -10
fi
