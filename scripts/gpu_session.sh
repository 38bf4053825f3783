#!/usr/bin/env bash
# Everything a GPU must confirm, in one run: every chapter executed live and recorded, the GPU tests,
# and compute-sanitizer over every kernel; then results/<gpu>/gpu_evidence.json records which kernel
# sources the tests and the sanitizer passed on (scripts/gpu_evidence.py). Logs and executed notebooks
# go to OUTDIR.
#
#   scripts/gpu_session.sh OUTDIR [chapter ...]      (default: every chapter)
#
# KERNELBOOK_SANITIZE="name ..." restricts compute-sanitizer to those workloads of scripts/sanitize.py
# (default: all of them). KERNELBOOK_COMMIT=<sha> names the commit the records were measured at; set
# it from the checkout that sent the tree when the GPU machine's copy of .git may be stale (a copied
# working tree can carry an old HEAD: records then name the wrong commit).
#
# Needs a CUDA GPU, nvcc, and the Python packages of requirements.txt; ncu and compute-sanitizer
# steps are skipped (with a message) where those tools are not installed.
set -uo pipefail
out=${1:?usage: scripts/gpu_session.sh OUTDIR [chapter ...]}
shift
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 KERNELBOOK_CACHE=${KERNELBOOK_CACHE:-$HOME/.cache/kernelbook}
py=${PYTHON:-python3}
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
  | tee "$out/nvidia-smi.csv"

step "chapters, executed live and recorded"
$py scripts/run_notebooks.py --record --out "$out/executed" "$@" 2>&1 | tee "$out/notebooks.log" || status=1
cp -r results "$out/" 2>/dev/null

step "GPU tests"
$py -m pytest -q -m gpu -p no:cacheprovider --junitxml="$out/pytest-gpu.xml" tests 2>&1 | tee "$out/pytest-gpu.log" | tail -n 15
[ "${PIPESTATUS[0]}" = 0 ] || status=1

if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck initcheck synccheck; do
    step "compute-sanitizer --tool $tool"
    compute-sanitizer --tool "$tool" --error-exitcode 1 $py scripts/sanitize.py ${KERNELBOOK_SANITIZE:-} \
      > "$out/sanitizer-$tool.log" 2>&1
    rc=$?
    echo "$rc" > "$out/sanitizer-$tool.rc"
    tail -n 4 "$out/sanitizer-$tool.log"
    [ "$rc" = 0 ] || status=1
  done
else
  echo "compute-sanitizer not installed: sanitizer runs skipped" | tee "$out/sanitizer-skipped.log"
fi

step "GPU evidence record"
$py scripts/gpu_evidence.py "$out" || status=1
step "done, status $status"
exit $status
