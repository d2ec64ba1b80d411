# Part D (4-GPU host): the final defaults (small models keep layers gathered, fsdp._reshard_layers) with 16k-token
# micro-batches: 0.5B at 1 (one process), 2 and 4 GPUs, then 1.5B and 3B at 4 GPUs, all rows in this run.
source benchmarks/device/setup.sh
python3 benchmarks/bench_fsdp.py --steps 3 --warmup 2 --out "$OUT/fsdp_d.md" --row-timeout 150 \
  --rows "${ROWS:-plain:mbt16384,0.5b:2:mbt16384,0.5b:4:mbt16384,1.5b:4:mbt16384,3b:4:mbt16384}" \
  2>&1 | tee "$OUT/fsdp_d.log"
