"""``bidir-ring``: half of every block clockwise, the other half counter-clockwise."""
from __future__ import annotations

from ..request import CollectiveError
from ..steps import chain, merge, ring_ag, ring_rs
from .registry import algorithm


@algorithm("bidir-ring", rank=1, lines=True)
def bidir_ring(kind: str, grid, root: int) -> tuple[int, list]:
    """Blocks ``2i`` travel clockwise, blocks ``2i + 1`` counter-clockwise."""
    order, n = grid.order, len(grid.order)
    if kind == "all_to_all":
        raise CollectiveError("algorithm 'bidir-ring' does not apply to all_to_all (use ring, direct, 2d or hier)")
    if kind == "broadcast":
        r = order.index(root)
        return 2, merge(chain(order, r, (0,), True), chain(order, r, (1,), False))
    cw = lambda p: (2 * order[p],)  # noqa: E731
    ccw = lambda p: (2 * order[p] + 1,)  # noqa: E731
    steps = []
    if kind != "all_gather":
        steps += merge(ring_rs(order, cw), ring_rs(order, ccw, forward=False))
    if kind != "reduce_scatter":
        steps += merge(ring_ag(order, cw), ring_ag(order, ccw, forward=False))
    return 2 * n, steps
