# One 4-GPU host: issue 23 Must 2 with CUDA graphs on replicas (session 12). Rows of bench_fsdp.py, in turn, after
# WARMUP (default 30) warm-up steps, STEPS (10) timed: the one-process default (graphs) and 2 and 4 replicas at the
# defaults (graphs, each gradient bucket's sum started behind its mark in the last replay); ROWS overrides.
# CHECK=1 (default) first runs, side by side on separate GPUs (numerics only, no timing): check_graphs.py with 2
# replicas (GPUs 0-1) and with one process (GPU 2), and on GPU 3 bench_trainer's mixed row with the narrow shapes
# recorded ahead (defaults) against knob n (each recorded when it first comes), EARLY (3) warm-up steps.
source benchmarks/device/setup.sh
export TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0
if [ "${CHECK:-1}" = 1 ]; then
  CUDA_VISIBLE_DEVICES=0,1 timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    benchmarks/check_graphs.py --steps "${CHECK_STEPS:-4}" > "$OUT/check2.md" 2> /tmp/check2.err &
  CUDA_VISIBLE_DEVICES=2 timeout 300 python3 benchmarks/check_graphs.py --steps "${CHECK_STEPS:-4}" \
    > "$OUT/check1.md" 2> /tmp/check1.err &
  D=a:0:a:auto:a
  CUDA_VISIBLE_DEVICES=3 timeout 300 python3 benchmarks/bench_trainer.py --isolate --repeat 1 --steps 9 \
    --warmup "${EARLY:-3}" --lengths mixed --no-grad-check --ours-mixed "$D,$D:-:0:n" --atropos "" \
    --out "$OUT/early.md" > "$OUT/early.log" 2>&1 &
  wait
  for f in check2 check1; do echo "== $f"; cat "$OUT/$f.md"; grep -v "^W1\|warn" "/tmp/$f.err" | tail -6; done
  tail -c 200000 /tmp/check2.err > "$OUT/check2.err"
  echo "== early"; cat "$OUT/early.md" 2>/dev/null; grep "CUDA graphs\|Error" "$OUT/early.log" | head
fi
ROWS="${ROWS:-plain,0.5b:2,0.5b:4}"
timeout "${FSDP_TIMEOUT:-420}" python3 benchmarks/bench_fsdp.py --steps "${STEPS:-10}" --warmup "${WARMUP:-30}" \
  --row-timeout "${ROW_TIMEOUT:-150}" --logs /tmp/rows --rows "$ROWS" --out "$OUT/fsdp.md" 2>&1 \
  | grep -v "Warning\|warn" | tee "$OUT/fsdp.log"
tar czf "$OUT/rows.tgz" -C /tmp rows 2>/dev/null
