"""The closing block every benchmark prints: the targets table, the total wall time, and
optionally every number as JSON."""
from __future__ import annotations

import json
import platform
import time

from tabulate import tabulate


def target(what: str, measured: str, ok: bool) -> dict:
    """One row of the targets table ``finish`` prints."""
    return {"target": what, "measured": measured, "pass": bool(ok)}


def finish(targets: list, t0: float, json_path: str | None, payload: dict) -> None:
    """Print ``targets`` (dicts with ``target``, ``measured``, ``pass``) and the seconds since
    ``t0``; write ``payload`` plus targets, wall time and platform to ``json_path`` if given."""
    print("\ntargets\n" + tabulate([(t["target"], t["measured"], "PASS" if t["pass"] else "FAIL") for t in targets],
                                   headers=("target", "measured", ""), disable_numparse=True))
    total = time.perf_counter() - t0
    print(f"\n{total:.0f} s on {platform.python_implementation()} {platform.python_version()}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(dict(payload, targets=targets, wall_s=total, python=platform.python_version(),
                           platform=platform.platform()), fh, indent=1)
