R=$OUT; export OUT=/tmp/fg; mkdir -p $OUT /tmp/ht
C=$(cat .commit); export FUSED_GEGLU_COMMIT=$C FUSED_GEGLU_DIRTY=0
bash benchmarks/h200_session.sh build > $OUT/s.log 2>&1
tail -2 $OUT/s.log
export PYTHONPATH=/tmp/site:$PWD/src HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub-cache
for s in gemma3-1b gemma-2b gemma2-9b; do timeout 120 python3 benchmarks/diag/host_time.py --shape $s --tokens 1,16,1024 --forced --out /tmp/ht 2>&1 | grep -v -i warn | tee -a $R/host.log; done
python3 -c "
import json,glob,sys; rows=[]; meta={}
for f in sorted(glob.glob('/tmp/ht/*.json')):
    d=json.load(open(f)); rows+=d['rows']; meta={k:v for k,v in d.items() if k!='rows'}
meta['commit']='$C'; meta['rows']=rows; json.dump(meta,open('$R/host-time-h200-${C:0:7}.json','w'),indent=1)"
TEST_TIMEOUT=240 PYTEST_ARGS="-n 8 --ignore=tests/test_tensor_parallel.py" bash benchmarks/h200_session.sh test > $OUT/t.log 2>&1
cp $OUT/test.log $R/
grep -E "FAILED|ERROR" $OUT/test.log | head -20
tail -2 $OUT/t.log
BENCH_ARGS="--ops geglu_mlp --rounds 3" BENCH_TIMEOUT=200 BENCH_BUDGET=170 bash benchmarks/h200_session.sh bench > $OUT/b.log 2>&1
cp $OUT/nvidia-h200*.json $OUT/nvidia-h200*.png $R/ 2>/dev/null; cp $OUT/bench.log $R/
tail -45 $OUT/bench.log
timeout 60 python3 benchmarks/diag/train_profile.py --shape gemma2-9b --tokens 8192 --steps 5 --out $R 2>&1 | grep -v -i warn | head -40
