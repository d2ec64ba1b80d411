# The 1-GPU FSDP overhead, variant by variant, four at a time (one GPU each), plus a profile of one step.
source benchmarks/device/setup.sh
B="python3 benchmarks/bench_fsdp.py --steps 4 --warmup 2"
$B --gpu 0 --rows plain,0.5b:1:prof > $OUT/v0.log 2>&1 &
$B --gpu 1 --rows 0.5b:1:nocompile,0.5b:1:k=f > $OUT/v1.log 2>&1 &
$B --gpu 2 --rows 0.5b:1:k=r,0.5b:1:k=r+f > $OUT/v2.log 2>&1 &
$B --gpu 3 --rows 0.5b:1:mbt16384,0.5b:1:k=r+f:mbt16384 > $OUT/v3.log 2>&1 &
wait
grep -h "^| [0p]" $OUT/v*.log
