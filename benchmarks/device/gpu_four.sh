# One 4-GPU host, two calls (each has 10 minutes):
#   PART=async: issue 24 Must 5, two 2-GPU jobs side by side: GPUs 0-1 the shipped tiny model (it learns: the reward
#     curves of sync vs async 1), GPUs 2-3 the 0.5B shape (steady-state steps/s), each on arithmetic and count.
#   PART=fsdp: issue 23 Must 2, weak scaling at 2 and 4 GPUs at the defaults (`--parallel auto`) beside forced FSDP,
#     the 1.5B / 3B rows, and the one-process 1.5B row (the MFU ordering).
source benchmarks/device/setup.sh
if [ "${PART:-async}" = async ]; then
  CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/bench_async.py --models tiny --modes "sync,async 1" \
    --steps "${TINY_STEPS:-60}" --warmup 3 --groups 32 --long-tokens 256 --timeout 130 \
    --out "$OUT/async_tiny.md" > "$OUT/async_tiny.log" 2>&1 &
  CUDA_VISIBLE_DEVICES=2,3 python3 benchmarks/bench_async.py --models 0.5b --modes "sync,async 1" \
    --steps "${STEPS:-10}" --warmup 2 --groups 32 --long-tokens "${LONG:-384}" --timeout 130 \
    --out "$OUT/async_05b.md" > "$OUT/async_05b.log" 2>&1 &
  wait
  grep -h '^{"mode"' "$OUT"/async_*.log
else
  timeout "${FSDP_TIMEOUT:-560}" python3 benchmarks/bench_fsdp.py --steps 3 --warmup 2 --row-timeout 110 \
    --rows "${FSDP_ROWS:-plain,0.5b:2,0.5b:2:fsdp,0.5b:4,0.5b:4:fsdp,plain:1.5b,1.5b:4,1.5b:4:fsdp,3b:4}" \
    --out "$OUT/fsdp.md" 2>&1 | grep -v "Warning\|warn" | tee "$OUT/fsdp.log"
fi
