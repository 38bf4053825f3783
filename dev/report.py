"""The dev prototypes' one report: the results as JSON, then ALL OK or FAILED by every check row's "*_ok" flags."""

from __future__ import annotations

import json


def finish(res: dict) -> int:
    """Print ``res`` and the verdict; the exit status (0: every check row's ``*_ok`` flags hold)."""
    print(json.dumps(res, indent=1))
    ok = all(r[k] for r in res["checks"] for k in r if k.endswith("_ok"))
    print("ALL OK" if ok else "FAILED")
    return 0 if ok else 1
