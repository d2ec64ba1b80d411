# Part C (4-GPU host): the 0.5B weak scaling again with 16k-token micro-batches (half the micro-batches: FSDP's
# per-micro-batch host cost halves), all rows in this run; then the one-command loop on 4 GPUs.
source benchmarks/device/setup.sh
python3 benchmarks/bench_fsdp.py --steps 4 --warmup 2 --out "$OUT/fsdp_c.md" \
  --rows "${ROWS:-plain:mbt16384,0.5b:1:mbt16384,0.5b:2:mbt16384,0.5b:4:mbt16384,0.5b:4:mbt16384:k=r}" \
  2>&1 | tee "$OUT/fsdp_c.log"
start=$(date +%s)
timeout 200 python3 -m atropos_cli train arithmetic --nproc-per-node 4 --steps "${LOOP_STEPS:-100}" --out /tmp/loop \
  > "$OUT/loop4.log" 2>&1
echo "one-command loop wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/loop4.log"
grep -v "^\[rank" "$OUT/loop4.log" | tail -4
cp /tmp/loop/metrics.jsonl "$OUT/loop4_metrics.jsonl"
