"""``direct``: one shot, every member sends each block straight to the member that needs it
(an all-to-all: every block straight to its member in one step)."""
from __future__ import annotations

from ..steps import Xfer
from .registry import algorithm


def _a2a_direct(grid) -> tuple[int, list]:
    n = len(grid.order)
    return n * n, [[Xfer(s, d, (s * n + d,), False) for s in range(n) for d in range(n) if d != s]]


@algorithm("direct", rank=3)
def direct(kind: str, grid, root: int) -> tuple[int, list]:
    n = len(grid.order)
    if kind == "all_to_all":
        return _a2a_direct(grid)
    if kind == "broadcast":
        return 1, [[Xfer(root, m, (0,), False) for m in range(n) if m != root]]
    rs = [[Xfer(s, d, (d,), True) for s in range(n) for d in range(n) if d != s]]
    ag = [[Xfer(s, d, (s,), False) for s in range(n) for d in range(n) if d != s]]
    return n, (rs if kind != "all_gather" else []) + (ag if kind != "reduce_scatter" else [])
