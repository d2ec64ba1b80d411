# One 4-GPU host, one call (under 7 minutes), three jobs side by side, one GPU each:
# GPU 0: the 1.5B one-process rows with recompiles counted in the timed steps (TORCH_LOGS=recompiles says why),
#        default allocator and expandable segments (the 1.5B MFU anomaly, issue 23 Must 2);
# GPU 1: the engine's decode attention at batch 64, fused (f) against Triton (t) (Must 3);
# GPU 2: the one-command loop's step split with Triton decode attention as the default (Must 4).
source benchmarks/device/setup.sh
(TORCH_LOGS=recompiles timeout 330 python3 benchmarks/bench_fsdp.py --gpu 0 --steps 3 --warmup 2 --logs "$OUT/rows" \
  --rows "${BIG_ROWS:-plain:1.5b,plain:1.5b:exp}" --out "$OUT/fsdp.md" > /dev/null 2>&1) &
(CUDA_VISIBLE_DEVICES=1 GEN_BATCHES=64 timeout 330 bash benchmarks/device/gen_engine.sh > "$OUT/gen.log" 2>&1) &
CUDA_VISIBLE_DEVICES=2 LOOP_STEPS=${LOOP_STEPS:-6} LOOP_TIMEOUT=330 bash benchmarks/device/loop_split.sh > /dev/null 2>&1
wait
echo "== 1.5B"; cat "$OUT/fsdp.md"; grep -h -i "recompiling\|triggered by\|guard" "$OUT"/rows/*.log | sort | uniq -c | head -20
echo "== loop"; cat "$OUT/loop_split.md" 2>/dev/null || tail -20 "$OUT/loop.log"
echo "== engine"; cat "$OUT/generation.md" 2>/dev/null || grep "^|\|Error" "$OUT/gen.log" | tail -30
