# Part B (4-GPU host): the 7B shape (full fine-tuning, LoRA r=16), a simulated two-node run against one launcher,
# and the one-command loop on 4 GPUs.
source benchmarks/device/setup.sh
python3 benchmarks/bench_fsdp.py --rows "${ROWS:-7b:4:micro,7b:4:lora16}" --steps 3 --warmup 2 \
  --out "$OUT/fsdp_b.md" 2>&1 | tee "$OUT/fsdp_b.log"
bash benchmarks/device/two_nodes.sh 2>&1 | tee "$OUT/two_nodes.log"
start=$(date +%s)
python3 -m atropos_cli train arithmetic --nproc-per-node 4 --steps "${LOOP_STEPS:-40}" --out /tmp/loop \
  2>&1 | tee "$OUT/loop4.log"
echo "one-command loop wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/loop4.log"
cp /tmp/loop/metrics.jsonl "$OUT/loop4_metrics.jsonl"
