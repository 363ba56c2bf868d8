R=$OUT; export OUT=/tmp/fg; mkdir -p $OUT
export FUSED_GEGLU_COMMIT=$(cat .commit) FUSED_GEGLU_DIRTY=0
bash benchmarks/h200_session.sh build > $OUT/s.log 2>&1
tail -3 $OUT/s.log
export PYTHONPATH=/tmp/site:$PWD/src HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
for s in gemma3-1b gemma-2b gemma2-9b; do timeout 90 python3 benchmarks/diag/host_time.py --shape $s --tokens 16,1024,8192 --parts --out $R 2>&1 | grep -v Warn | tee -a $R/host.log; done
timeout 150 python3 benchmarks/diag/decode_pdl.py --out $R --rounds 7 --variants end,down-s2,down-s6,down-s8,down-bn32 2>&1 | tail -25 | tee $R/decode.log
TEST_TIMEOUT=230 PYTEST_ARGS="-n 8 --ignore=tests/test_tensor_parallel.py" bash benchmarks/h200_session.sh test > $OUT/t.log 2>&1
cp $OUT/test.log $R/ ; cp $OUT/sass_hgmma.txt $R/ 2>/dev/null
grep -E "FAILED|ERROR" $OUT/test.log | head -20
tail -4 $OUT/t.log
