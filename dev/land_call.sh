#!/usr/bin/env bash
# dev/land_call.sh — one device call that re-proves a kernels/ change: every extension built in parallel first, then
# scripts/gpu_session.sh on the named chapters (executed live and recorded; the GPU tests; compute-sanitizer's four
# tools over every workload; the GPU-evidence record). Run from the repository root on the device with the wheels
# carried in .whl/wheels (carry [".whl"]); KERNELBOOK_COMMIT names the commit the tree was sent at.
#   bash dev/land_call.sh 07_capstone_conv_bn_scale      → $OUT/session.log, $OUT/records.tgz (results/, logs)
# and, where the call has time left (CALL_S, 570 s after the wheels), dev/cbw's variants (CBW_VARIANTS) checked and timed
# ($OUT/cbw.json) and dev/cbw/ceiling.py ($OUT/ceiling.json); records.tgz is written before them.
set -o pipefail
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/wheels/*.whl || exit 3
  touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KERNELBOOK_CACHE=/tmp/kbcache TORCH_EXTENSIONS_DIR=/tmp/torch_ext
t0=$(date +%s)
CBW=${CBW_VARIANTS:-t3.f1.l1 t3.f1.l1.d3 t3.f1.l1.d5 t9.f1.l1.d5 t3.f1.l1.d5.x136.k1 t3.f1.l1.r2.d5 t3.f1.l1.x136 t3.f1.l1.x136.k1 t3.f1.l1.g1 t3.f1.l1.g1.x136 t3.f1.l1.r2 t9.f1.l1.r1 t3.f1.l1.x136.w1 t3.f1.l1.x136.w2 t3.f1.l1.x136.w1.d5 t3.f1.l1.s1 t3.f1.l1.s2}
python3 dev/cbw/variants.py --build-only $CBW > /tmp/build-cbw.log 2>&1 &  # not waited for
cbw_build=$!
python3 dev/cbw/ceiling.py --build-only > /tmp/build-ceiling.log 2>&1 &
pids=()
for k in bn_train ceilings conv2d_folded conv3d_gn_mean conv_bn_scale cutlass_conv cutlass_gemm gemm_3xtf32 \
         gemm_wgmma group_stats mappings mma_probe scale; do
  python3 -c "import kernelbook as kb; kb.build.load('$k')" > /tmp/build-$k.log 2>&1 || echo "build $k failed" &
  pids+=($!)
done
wait "${pids[@]}"
echo "builds: $(( $(date +%s) - t0 )) s"
timeout ${SESSION_S:-530} bash scripts/gpu_session.sh /tmp/gs "$@" 2>&1 | tee $OUT/session.log
# the landing's record first: a call cut short by the experiments after it still returns it
tar czf $OUT/records.tgz results -C /tmp/gs nvidia-smi.csv pytest-gpu.log notebooks.log \
  $(cd /tmp/gs && ls sanitizer-* 2>/dev/null)
left() { echo $(( ${CALL_S:-570} - ($(date +%s) - t0) )); }  # t0 is after the wheels' install
if [ $(left) -gt 60 ]; then  # dev/cbw's variants and the layout ceilings on the H200, in the time left
  wait $cbw_build
  timeout $(( $(left) - 45 )) python3 dev/cbw/variants.py --quick $CBW > $OUT/cbw.json 2>&1
  grep -A30 timing_ms $OUT/cbw.json
  [ $(left) -gt 45 ] && timeout 40 python3 dev/cbw/ceiling.py > $OUT/ceiling.json 2>&1
  grep -B1 tflops $OUT/ceiling.json
fi
echo "total: $(( $(date +%s) - t0 )) s" | tee -a $OUT/session.log
