#!/usr/bin/env bash
# dev/lite_call.sh — the smallest useful device call (≈ 200 s on an H200): dev/cbw's variants checked and timed
# against the landed kernel, and P27's wgmma prototype checked and timed. No sanitizers, no profiles, no records.
# Carry [".whl"] (the wheels in .whl/wheels). Results: $OUT/variants.json, $OUT/p27w.json.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KERNELBOOK_CACHE=/tmp/kbcache TORCH_EXTENSIONS_DIR=/tmp/torch_ext
t0=$(date +%s)
V=${V:-"t1 t3 t3.f1.l1 t3.f1.l1.s1"}
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv,noheader
for v in $V; do python3 dev/cbw/variants.py --build-only $v > /tmp/b-$v.log 2>&1 & done
python3 -c "import kernelbook as kb; kb.build.load('conv_bn_scale'); kb.build.load('conv3d_gn_mean')" > /tmp/b-kb.log 2>&1 &
python3 dev/p27w/run.py --build-only --nd 3 > /tmp/b-p27w.log 2>&1 &
wait
echo "builds: $(( $(date +%s) - t0 )) s"; grep -il error /tmp/b-*.log && tail -20 $(grep -il error /tmp/b-*.log)
timeout 150 python3 dev/cbw/variants.py $V > $OUT/variants.json 2>&1; tail -c 2500 $OUT/variants.json
timeout 90 python3 dev/p27w/run.py --nd 3 > $OUT/p27w.json 2>&1; tail -c 2500 $OUT/p27w.json
echo "total: $(( $(date +%s) - t0 )) s"
