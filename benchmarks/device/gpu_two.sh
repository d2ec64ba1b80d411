# One 2-GPU call: FSDP weak scaling at the defaults of the day (plain = one process, no FSDP; 0.5b:2) and the
# 1.5B / 3B rows at 2 GPUs (the MFU ordering), then the async loop (1 trainer GPU + 1 engine GPU) against the
# synchronous loop on the same 2 GPUs (the 0.5B shape, arithmetic).
source benchmarks/device/setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader | head -2
timeout ${FSDP_TIMEOUT:-290} python3 benchmarks/bench_fsdp.py --steps 3 --warmup 2 --row-timeout 110 \
  --rows "${FSDP_ROWS:-plain,0.5b:2,1.5b:2,3b:2}" --out "$OUT/fsdp.md" 2>&1 | grep -v "Warning\|warn" | tee "$OUT/fsdp.log"
timeout ${ASYNC_TIMEOUT:-250} python3 benchmarks/bench_async.py --models 0.5b --envs arithmetic \
  --modes "sync,async 1" --steps ${STEPS:-6} --warmup 1 --groups 32 --timeout 115 --out "$OUT/async.md" 2>&1 \
  | grep -v "Warning\|warn" | tee "$OUT/async.log"
