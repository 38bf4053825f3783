#!/usr/bin/env bash
# dev/land_call.sh — one device call that re-proves a kernels/ change: every extension built in parallel first, then
# scripts/gpu_session.sh on the named chapters (executed live and recorded; the GPU tests; compute-sanitizer's four
# tools over every workload; the GPU-evidence record). Run from the repository root on the device with the wheels
# carried in .whl/wheels (carry [".whl"]); KERNELBOOK_COMMIT names the commit the tree was sent at.
#   bash dev/land_call.sh 07_capstone_conv_bn_scale      → $OUT/session.log, $OUT/records.tgz (results/, logs)
# and, where the call has time left, dev/p27w's prototype checked and timed ($OUT/p27w.json), then dev/mw's ($OUT/mw.json).
set -o pipefail
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/wheels/*.whl || exit 3
  touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KERNELBOOK_CACHE=/tmp/kbcache TORCH_EXTENSIONS_DIR=/tmp/torch_ext
t0=$(date +%s)
python3 dev/p27w/run.py --build-only --nd 2,3 --version 1,2,3 > /tmp/build-p27w.log 2>&1 &  # not waited for
p27w_build=$!
python3 dev/mw/run.py --build-only --kg 1,2 > /tmp/build-mw.log 2>&1 &
mw_build=$!
python3 dev/edge/run.py --build-only > /tmp/build-edge.log 2>&1 &
edge_build=$!
pids=()
for k in bn_train ceilings conv2d_folded conv3d_gn_mean conv_bn_scale cutlass_conv cutlass_gemm gemm_3xtf32 \
         gemm_wgmma group_stats mappings mma_probe scale; do
  python3 -c "import kernelbook as kb; kb.build.load('$k')" > /tmp/build-$k.log 2>&1 || echo "build $k failed" &
  pids+=($!)
done
wait "${pids[@]}"
echo "builds: $(( $(date +%s) - t0 )) s"
timeout ${SESSION_S:-530} bash scripts/gpu_session.sh /tmp/gs "$@" 2>&1 | tee $OUT/session.log
if [ $(( $(date +%s) - t0 )) -lt ${P27W_BEFORE:-470} ]; then  # P27's wgmma prototype, if the call has time left
  wait $p27w_build
  timeout 90 python3 dev/p27w/run.py --nd 2,3 --version 1,2,3 > $OUT/p27w.json 2>&1; grep -A20 timing_ms $OUT/p27w.json
fi
if [ $(( $(date +%s) - t0 )) -lt ${MW_BEFORE:-530} ]; then  # the moments' lag sums on wgmma, if time is left
  wait $mw_build
  timeout 60 python3 dev/mw/run.py --kg 1,2 > $OUT/mw.json 2>&1; tail -1 $OUT/mw.json
fi
if [ $(( $(date +%s) - t0 )) -lt ${EDGE_BEFORE:-560} ]; then  # the border sums, S samples a block
  wait $edge_build
  timeout 30 python3 dev/edge/run.py > $OUT/edge.json 2>&1; tail -1 $OUT/edge.json
fi
echo "total: $(( $(date +%s) - t0 )) s" | tee -a $OUT/session.log
tar czf $OUT/records.tgz results -C /tmp/gs nvidia-smi.csv pytest-gpu.log notebooks.log $(cd /tmp/gs && ls sanitizer-* 2>/dev/null)
