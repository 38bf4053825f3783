#!/usr/bin/env bash
# dev/adaptive_call.sh — one device call that uses whichever GPU came. On an H200: the landing (dev/land_call.sh on the
# named chapters; KERNELBOOK_COMMIT names the tree; dev/cbw's variants after it if time is left). On anything else
# (an H100 cannot land a record), ≈ 300–450 s, the builds most of it: dev/cbw's variants (CBW_VARIANTS) checked,
# timed, sanitized (SAN_TOOLS: memcheck racecheck, on CBW_NEW) and profiled (CBW_NCU); with RUN_P27W / RUN_MW /
# RUN_EDGE = 1 dev/p27w, dev/mw and dev/edge too; dev/cbw/ceiling.py's layout ceilings; the tree's conv_bn_scale
# GPU tests, eval's guard by kernel (dev/guard_probe.py) and memcheck on its workload. Carry [".whl"].   → $OUT/gpu.txt, $OUT/lean.tgz (every log)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu" | tee $OUT/gpu.txt
case "$gpu" in *H200*) exec bash dev/land_call.sh "$@" ;; esac
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/wheels/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KERNELBOOK_CACHE=/tmp/kbcache TORCH_EXTENSIONS_DIR=/tmp/torch_ext
t0=$(date +%s) O=/tmp/o; mkdir -p $O
ND=${P27W_ND:-3} VERS=${P27W_VERSIONS:-3,4} KG=${MW_KG:-2} TOOLS=${SAN_TOOLS:-memcheck racecheck}
CBW=${CBW_VARIANTS:-t3.f1.l1 t3.f1.l1.d3 t3.f1.l1.d5 t9.f1.l1.d5 t3.f1.l1.d5.x136.k1 t3.f1.l1.r2.d5 t3.f1.l1.x136 t3.f1.l1.x136.k1 t3.f1.l1.g1 t3.f1.l1.g1.x136 t3.f1.l1.r2 t9.f1.l1.r1 t3.f1.l1.x136.w1 t3.f1.l1.x136.w2 t3.f1.l1.x136.w1.d5 t3.f1.l1.s1 t3.f1.l1.s2} 
CBW_NEW=${CBW_NEW:-t3.f1.l1.g1.x136}
# 1: dev/p27w's (versions 3, 4), dev/mw's, dev/edge's runs too (the last two unchanged since measured);
# P27W_NCU=1 profiles dev/p27w too
P27W=${RUN_P27W:-1} MW=${RUN_MW:-0} EDGE=${RUN_EDGE:-0}
python3 -c "import kernelbook as kb; kb.build.load('conv3d_gn_mean'); kb.build.load('conv_bn_scale'); kb.build.load('gemm_wgmma')" \
  > $O/build-book.log 2>&1 &
[ $MW = 1 ] && python3 dev/mw/run.py --build-only --kg $KG > $O/build-mw.log 2>&1 &
[ $EDGE = 1 ] && python3 dev/edge/run.py --build-only > $O/build-edge.log 2>&1 &
python3 dev/cbw/variants.py --build-only $CBW > $O/build-cbw.log 2>&1 &
python3 dev/cbw/ceiling.py --build-only > $O/build-ceiling.log 2>&1 &
[ $P27W = 1 ] && python3 dev/p27w/run.py --build-only --nd $ND --version $VERS > $O/build-p27w.log 2>&1; wait
echo "builds: $(( $(date +%s) - t0 )) s"
timeout 150 python3 dev/cbw/variants.py $CBW > $O/cbw.json 2>&1; echo "cbw rc=$?"; tail -1 $O/cbw.json
grep -A60 '"timing_ms"' $O/cbw.json | head -70; grep -E "_ok|_vs_landed|\"case\"" $O/cbw.json | head -60
timeout 60 python3 dev/cbw/ceiling.py > $O/ceiling.json 2>&1; echo "ceiling rc=$?"; grep -B1 tflops $O/ceiling.json
if [ $P27W = 1 ]; then
  timeout 120 python3 dev/p27w/run.py --nd $ND --version $VERS > $O/p27w.json 2>&1; echo "run rc=$?"
  tail -1 $O/p27w.json; grep -A30 timing_ms $O/p27w.json
fi
if [ $MW = 1 ]; then
  timeout 90 python3 dev/mw/run.py --kg $KG > $O/mw.json 2>&1; echo "mw rc=$?"; tail -1 $O/mw.json
  grep -A8 '"timing_ms"\|"book_us"\|p73_16' $O/mw.json | head -30
fi
if [ $EDGE = 1 ]; then
  timeout 60 python3 dev/edge/run.py > $O/edge.json 2>&1; echo "edge rc=$?"; tail -1 $O/edge.json
  grep -A7 '"timing_ms"' $O/edge.json
fi
timeout 60 python3 dev/guard_probe.py > $O/guard.json 2>&1; echo "guard rc=$?"; tail -2 $O/guard.json
echo "timed: $(( $(date +%s) - t0 )) s"
tar czf $OUT/lean.tgz -C $O .  # again at the end: what a call cut short still returns
( timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_conv_bn_scale.py tests/test_conv_definition.py \
    > $O/pytest-gpu.log 2>&1; echo "pytest rc=$?" >> $O/pytest-gpu.log ) &
( timeout 200 compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize.py conv_bn_scale \
    > /tmp/san-book-memcheck.log 2>&1; echo "book memcheck rc=$?" >> /tmp/san-book-memcheck.log ) &
for tool in $TOOLS; do
  [ $P27W = 1 ] && ( timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 python3 dev/p27w/run.py --small \
      --nd $ND --version $VERS > /tmp/san-$tool.log 2>&1; echo "$tool rc=$?" >> /tmp/san-$tool.log ) &
  ( timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 python3 dev/cbw/variants.py --small $CBW_NEW \
      > /tmp/san-cbw-$tool.log 2>&1; echo "cbw $tool rc=$?" >> /tmp/san-cbw-$tool.log ) &
  [ $EDGE = 1 ] && ( timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 python3 dev/edge/run.py --small \
      > /tmp/san-edge-$tool.log 2>&1; echo "edge $tool rc=$?" >> /tmp/san-edge-$tool.log ) &
  [ $MW = 1 ] && ( timeout 150 compute-sanitizer --tool $tool --error-exitcode 1 python3 dev/mw/run.py --small --kg $KG \
      > /tmp/san-mw-$tool.log 2>&1; echo "mw $tool rc=$?" >> /tmp/san-mw-$tool.log ) &
done
wait; tail -n 3 /tmp/san-*.log | tee $O/sanitizer.txt; tail -n 4 $O/pytest-gpu.log
echo "sanitized: $(( $(date +%s) - t0 )) s"
[ $P27W = 1 ] && [ ${P27W_NCU:-0} = 1 ] && timeout 100 ncu --clock-control none -k regex:conv3d -c 4 --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats --section InstructionStats \
  python3 dev/p27w/run.py --ncu --nd $ND --version $VERS > $O/ncu.txt 2>&1; echo "ncu rc=$?"
grep -E "Duration|Compute \(SM\) Thro|Memory Thro|Registers|Achieved Occ|Executed Ipc|Stall|conv3d" $O/ncu.txt | head -40
[ $EDGE = 1 ] && timeout 60 ncu --clock-control none -k regex:"edge" -c 3 --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis python3 dev/edge/run.py --ncu \
  > $O/ncu-edge.txt 2>&1; echo "ncu edge rc=$?"
grep -E "edge_|Duration|Compute \(SM\) Thro|Memory Thro|Achieved Occ|Registers|L2 Hit|Mem Busy" $O/ncu-edge.txt | head -30
timeout 90 ncu --clock-control none -k regex:conv3x3 -c 3 --section SpeedOfLight --section WarpStateStats \
  --section InstructionStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  python3 dev/cbw/variants.py --ncu \
  ${CBW_NCU:-t3.f1.l1 t3.f1.l1.d5} \
  > $O/ncu-cbw.txt 2>&1
echo "ncu cbw rc=$?"; grep -E "Duration|DRAM Thro|Compute \(SM\) Thro|Warp Cycles Per Issued|Issued Instructions |Shared|Bank" \
  $O/ncu-cbw.txt | head -40
[ $MW = 1 ] && timeout 60 ncu --clock-control none -k regex:moments_wgmma -c 1 --section SpeedOfLight --section WarpStateStats \
  --section MemoryWorkloadAnalysis python3 dev/mw/run.py --ncu --kg $KG > $O/ncu-mw.txt 2>&1; echo "ncu mw rc=$?"
grep -E "Duration|Compute \(SM\) Thro|Memory Thro|Stall" $O/ncu-mw.txt | head -12
cp /tmp/san-*.log $O/ 2>/dev/null; tar czf $OUT/lean.tgz -C $O .
echo "total: $(( $(date +%s) - t0 )) s"
