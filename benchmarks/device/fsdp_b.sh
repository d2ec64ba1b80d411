# Part B (4-GPU host): the 7B shape (full fine-tuning, LoRA r=16), the one-command loop on 4 GPUs, and a simulated
# two-node run against one launcher. Each part has its own time limit, so one that runs long leaves the others.
source benchmarks/device/setup.sh
timeout 330 python3 benchmarks/bench_fsdp.py --rows "${ROWS:-7b:4:micro,7b:4:lora16}" --steps 3 --warmup 2 \
  --row-timeout 200 --out "$OUT/fsdp_b.md" 2>&1 | tee "$OUT/fsdp_b.log"
start=$(date +%s)
timeout 140 python3 -m atropos_cli train arithmetic --nproc-per-node 4 --steps "${LOOP_STEPS:-100}" --out /tmp/loop \
  > "$OUT/loop4.log" 2>&1
echo "one-command loop wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/loop4.log"
tail -3 "$OUT/loop4.log"
cp /tmp/loop/metrics.jsonl "$OUT/loop4_metrics.jsonl"
timeout 110 bash benchmarks/device/two_nodes.sh > "$OUT/two_nodes.log" 2>&1
tail -4 "$OUT/two_nodes.log"
