"""``ring``: reduce-scatter then all-gather around one ring (``n - 1`` steps each); a
broadcast is a chain from the root; an all-to-all is pairwise shifts, at step ``k`` each
member sends to the member ``k`` ring positions ahead (``n - 1`` steps, one peer per step)."""
from __future__ import annotations

from ..steps import Xfer, chain, ring_ag, ring_rs
from .registry import algorithm


def _a2a_shift(grid) -> tuple[int, list]:
    order, n = grid.order, len(grid.order)
    return n * n, [[Xfer(order[p], order[(p + k) % n], (order[p] * n + order[(p + k) % n],), False) for p in range(n)]
                   for k in range(1, n)]


@algorithm("ring", rank=0, lines=True)
def ring(kind: str, grid, root: int) -> tuple[int, list]:
    if kind == "all_to_all":
        return _a2a_shift(grid)
    order = grid.order
    if kind == "broadcast":
        return 1, chain(order, order.index(root), (0,))
    own = lambda p: (order[p],)  # noqa: E731
    rs = ring_rs(order, own) if kind != "all_gather" else []
    ag = ring_ag(order, own) if kind != "reduce_scatter" else []
    return len(order), rs + ag
