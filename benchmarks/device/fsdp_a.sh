# Part A of the many-GPU measurements (4-GPU host): a one-step smoke row first (stop early if it fails), then weak
# scaling of the 0.5B shape at 1, 2, 4 GPUs beside the one-process trainer, then 1.5B and 3B at 4 GPUs.
source benchmarks/device/setup.sh
python3 benchmarks/bench_fsdp.py --rows 0.5b:2 --steps 1 --warmup 1 2>&1 | tail -1 | tee "$OUT/smoke.log"
grep -q "failed" "$OUT/smoke.log" && exit 1
python3 benchmarks/bench_fsdp.py --rows "${ROWS:-plain,0.5b:1,0.5b:2,0.5b:4,1.5b:4,3b:4}" --steps 4 --warmup 2 \
  --out "$OUT/fsdp_a.md" 2>&1 | tee "$OUT/fsdp_a.log"
