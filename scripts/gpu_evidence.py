#!/usr/bin/env python3
"""Turn a GPU session's logs into a record: which code the GPU tests and compute-sanitizer passed on.

    python scripts/gpu_evidence.py LOGDIR      # writes results/<gpu-slug>/gpu_evidence.json

LOGDIR holds what scripts/gpu_session.sh writes: ``pytest-gpu.xml`` (pytest's JUnit report of
``pytest -m gpu``) and, per compute-sanitizer tool, ``sanitizer-<tool>.log`` and ``sanitizer-<tool>.rc``
(its exit status). The record stores the SHA-256 of every file in kernels/, so a CPU test
(tests/test_records.py) fails when a kernel changed after the GPU last passed on it.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")


def tests(xml: Path) -> dict:
    """Counts from pytest's JUnit XML (summed over test suites)."""
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"], "failed": tot["failures"],
            "errors": tot["errors"], "skipped": tot["skipped"]}


def sanitizer(logdir: Path, tool: str) -> dict | None:
    log, rc = logdir / f"sanitizer-{tool}.log", logdir / f"sanitizer-{tool}.rc"
    if not log.is_file() or not rc.is_file():
        return None
    text = log.read_text(errors="replace")
    summaries = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", text)]
    workloads = re.findall(r"^workload (\S+): ok$", text, re.MULTILINE)
    return {"exit_code": int(rc.read_text().strip() or -1), "errors": sum(summaries), "processes": len(summaries),
            "workloads": workloads}


def main() -> int:
    import datetime as dt

    from kernelbook import device
    from kernelbook.harness.build import file_sha256
    from kernelbook.harness.paths import KERNELS, RESULTS
    from kernelbook.harness.records import _commit

    logdir = Path(sys.argv[1])
    g = device.gpu()
    if g is None:
        print("gpu_evidence: needs the GPU the logs came from (for its provenance)", file=sys.stderr)
        return 2
    rec = {
        "kind": "gpu_evidence",
        "provenance": {**{k: g[k] for k in ("gpu", "capability", "sm_count", "driver", "cuda", "torch")},
                       "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": _commit(),
                       "kernels": {f"kernels/{p.name}": file_sha256(p) for p in sorted(KERNELS.iterdir())
                                   if p.is_file()}},
        "tests": tests(logdir / "pytest-gpu.xml"),
        "sanitizer": {t: s for t in TOOLS if (s := sanitizer(logdir, t)) is not None},
    }
    out = RESULTS / g["slug"] / "gpu_evidence.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"{out.relative_to(ROOT)}: tests {rec['tests']}, sanitizer "
          + ", ".join(f"{t} {s['errors']} errors (exit {s['exit_code']})" for t, s in rec["sanitizer"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
