#!/usr/bin/env bash
# dev/quick_call.sh — one short device call: dev/cbw's named variants built (one extension), checked against float64
# beside cuDNN and timed on P73 without the book's extension (variants.py --quick, so no build of it), then one
# Nsight Compute profile of the first variant named in CBW_NCU, if set. Carry [".whl"].
#   bash dev/quick_call.sh t3.f1.l1 t9.f1.l1.r1        → stdout, $OUT/cbw.json
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
t0=$(date +%s)
python3 dev/cbw/variants.py --build-only "$@" > /tmp/build.log 2>&1  # one extension holds every variant
echo "build: $(( $(date +%s) - t0 )) s"; tail -n 2 /tmp/build.log
python3 dev/cbw/variants.py --quick "$@" > $OUT/cbw.json 2>&1; echo "rc=$?"
grep -A40 '"timing_ms"' $OUT/cbw.json; grep -E '"case"|_ok"' $OUT/cbw.json | tr -d ' \n' | sed 's/"case"/\n&/g'; echo
echo "timed: $(( $(date +%s) - t0 )) s"
if [ -n "$CBW_NCU" ]; then
  timeout 60 ncu --clock-control none -k regex:conv3x3 -c 1 --section SpeedOfLight --section WarpStateStats \
    --section MemoryWorkloadAnalysis python3 dev/cbw/variants.py --ncu $CBW_NCU > $OUT/ncu.txt 2>&1
  grep -E "Duration|Thro|Warp Cycles Per Issued|Shared|Bank" $OUT/ncu.txt | head -20
fi
echo "total: $(( $(date +%s) - t0 )) s"
