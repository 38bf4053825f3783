#!/usr/bin/env bash
# dev/next_call.sh — one device call (≈ 300 s on an H200): the wgmma convolution's variants built in parallel, checked
# and timed on P73 (dev/cbw/variants.py); P27's wgmma prototype checked and timed (dev/p27w/run.py); compute-
# sanitizer's four tools on the small shapes of both candidates; Nsight Compute on the landed kernel, the candidate
# and the P27 prototype. Run from the repository root on the device with the wheels
# carried in .whl/wheels (bash ../shared/tools/gpu-wheels.sh .whl/wheels; carry [".whl"]). Results under $OUT.
set -o pipefail
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/wheels/*.whl || exit 3
  touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KERNELBOOK_CACHE=/tmp/kbcache TORCH_EXTENSIONS_DIR=/tmp/torch_ext
V=${V:-"t1 t3 t3.l1 t3.f1.l1 t3.f2.l1 t3.f1.l1.s1"}
CAND=${CAND:-t3.f1.l1}
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
python3 dev/cbw/variants.py --resources $V > $OUT/resources.jsonl 2>&1
for v in $V; do python3 dev/cbw/variants.py --build-only $v > /tmp/build-$v.log 2>&1 & done
python3 -c "import kernelbook as kb; kb.build.load('conv_bn_scale'); kb.build.load('conv3d_gn_mean')" &
python3 dev/p27w/run.py --build-only --nd 2,3 > /tmp/build-p27w.log 2>&1 &
wait
echo "builds: $(( $(date +%s) - t0 )) s"; grep -il error /tmp/build-*.log
python3 dev/cbw/variants.py $V > $OUT/variants.json 2>&1; tail -1 $OUT/variants.json
python3 - $OUT/variants.json <<'PY'
import json, sys
text = open(sys.argv[1]).read()
res = json.loads(text[:text.rindex("}") + 1])
for r in res["checks"]:
    print(r["case"], " ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items() if k != "case"))
for k, v in res["timing_ms"].items():
    print(k, v)
PY
python3 dev/p27w/run.py --nd 2,3 > $OUT/p27w.json 2>&1; tail -1 $OUT/p27w.json; grep -A12 timing_ms $OUT/p27w.json
echo "timed: $(( $(date +%s) - t0 )) s"
for tool in memcheck racecheck initcheck synccheck; do
  ( compute-sanitizer --tool $tool --error-exitcode 1 python3 dev/cbw/variants.py --small $CAND > /tmp/san-$tool.log 2>&1
    echo "$tool rc=$?" >> /tmp/san-$tool.log
    compute-sanitizer --tool $tool --error-exitcode 1 python3 dev/p27w/run.py --small > /tmp/san-p27w-$tool.log 2>&1
    echo "p27w $tool rc=$?" >> /tmp/san-p27w-$tool.log ) &
done
# kernels/ as they stand, or as a landing patch applied first leaves them (tests only: the GPU is shared with the
# sanitizers, nothing is timed)
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_conv_bn_scale.py tests/test_conv_definition.py \
  > $OUT/pytest-landed.log 2>&1; echo "pytest rc=$?" >> $OUT/pytest-landed.log; tail -3 $OUT/pytest-landed.log
for v in $CAND; do
  ncu --clock-control none --set full --import-source yes -k regex:conv3x3_wgmma -s 1 -c 1 -o /tmp/ncu-$v \
    python3 dev/cbw/variants.py --ncu $v > /tmp/ncu-$v.log 2>&1
  ncu --import /tmp/ncu-$v.ncu-rep --page details > /tmp/det-$v.txt 2>&1
done
wait
ncu --clock-control none --set full -k regex:conv3d_wgmma -s 1 -c 1 -o /tmp/ncu-p27w python3 dev/p27w/run.py --ncu \
  > /tmp/ncu-p27w.log 2>&1; ncu --import /tmp/ncu-p27w.ncu-rep --page details > /tmp/det-p27w.txt 2>&1
for tool in memcheck racecheck initcheck synccheck; do tail -2 /tmp/san-$tool.log /tmp/san-p27w-$tool.log; done | tee $OUT/sanitizers.log
grep -E "Duration|Issue Slots Busy|Executed Ipc A|Compute \(SM\) Throughput|Memory Throughput|Registers Per" /tmp/det-*.txt
tar czf $OUT/ncu.tgz -C /tmp $(cd /tmp && ls ncu-*.ncu-rep det-*.txt 2>/dev/null)
echo "total: $(( $(date +%s) - t0 )) s"
