# One 4-GPU host, one call (under 7 minutes), jobs side by side, one GPU each (issue 23, session 9, call 3): the
# engine with fused projections (fuse.py) and the decode loop one replay ahead (engine._run).
# GPU 0: bench_generation at batch 512 and 64, Triton decode attention, transformers generate beside (Must 3);
# GPU 1: the engine profile at batch 64; GPU 3: at batch 512 (`profile_engine.py`);
# GPU 2: the one-command loop's step split, 6 steps (Must 4).
source benchmarks/device/setup.sh
(CUDA_VISIBLE_DEVICES=0 GEN_BATCHES=512,64 GEN_VARIANTS=8:1:t timeout 400 bash benchmarks/device/gen_engine.sh \
  > "$OUT/gen.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 400 python3 benchmarks/profile_engine.py --batches 64 \
  --out "$OUT/engine_profile_64.md" > "$OUT/profile64.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=3 timeout 400 python3 benchmarks/profile_engine.py --batches 512 \
  --out "$OUT/engine_profile_512.md" > "$OUT/profile512.log" 2>&1) &
CUDA_VISIBLE_DEVICES=2 LOOP_STEPS=${LOOP_STEPS:-6} LOOP_TIMEOUT=400 bash benchmarks/device/loop_split.sh > /dev/null 2>&1
wait
echo "== engine"; cat "$OUT/generation.md" 2>/dev/null || grep "^|\|Error" "$OUT/gen.log" | tail -30
echo "== loop"; cat "$OUT/loop_split.md" 2>/dev/null || tail -20 "$OUT/loop.log"
for b in 64 512; do echo "== profile $b"; head -32 "$OUT/engine_profile_$b.md" 2>/dev/null || tail -30 "$OUT/profile$b.log"; done
