# One 4-GPU host, one call (under 7 minutes), jobs side by side, one GPU each (issue 23, session 9, call 4):
# GPU 0: the trainer, defaults, mixed and equal lengths, Atropos' example_trainer in the same run (Must 1, 5);
# GPU 1: the mixed-length step profiled phase by phase (`profile_timeline.py`) (Must 1);
# GPU 2: bench_generation at batch 512 and 64, Triton decode attention, transformers generate beside (Must 3);
# GPU 3: the one-command loop's step split, 6 steps (Must 4).
source benchmarks/device/setup.sh
(CUDA_VISIBLE_DEVICES=0 TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 timeout 400 \
  python3 benchmarks/bench_trainer.py --steps 6 --warmup 3 --lengths mixed,equal --no-grad-check \
  --ours-mixed "a:0:a:auto:a" --ours-equal "a:0:a:auto:a" --atropos 32:1 \
  --out "$OUT/trainer.md" > "$OUT/trainer.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 400 python3 benchmarks/profile_timeline.py --variant a:0:a:auto:a --mixed \
  --out "$OUT/prof_mixed" > "$OUT/prof_mixed.log" 2>&1; rm -f "$OUT"/prof_mixed/*.json*) &
(CUDA_VISIBLE_DEVICES=2 GEN_BATCHES=512,64 GEN_VARIANTS=8:1:t timeout 400 bash benchmarks/device/gen_engine.sh \
  > "$OUT/gen.log" 2>&1) &
CUDA_VISIBLE_DEVICES=3 LOOP_STEPS=${LOOP_STEPS:-6} LOOP_TIMEOUT=400 bash benchmarks/device/loop_split.sh > /dev/null 2>&1
wait
echo "== trainer"; cat "$OUT/trainer.md" 2>/dev/null || grep -v "^W1\|warn" "$OUT/trainer.log" | tail -30
echo "== engine"; cat "$OUT/generation.md" 2>/dev/null || grep "^|\|Error" "$OUT/gen.log" | tail -30
echo "== loop"; cat "$OUT/loop_split.md" 2>/dev/null || tail -20 "$OUT/loop.log"
echo "== profile mixed"; grep -v "^W1\|warn" "$OUT/prof_mixed.log" | head -24
