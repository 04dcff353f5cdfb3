"""``tree``: recursive doubling (all-reduce exchanges the whole buffer, ``log2 n`` steps),
recursive halving for reduce-scatter, a binomial tree for broadcast."""
from __future__ import annotations

from ..request import CollectiveError
from ..steps import Xfer, doubling_all_reduce
from .registry import algorithm


@algorithm("tree", rank=4, lines=True)
def tree(kind: str, grid, root: int) -> tuple[int, list]:
    """Recursive doubling / halving over ring positions (partners at distance 1, 2, 4, ...)."""
    order, n = grid.order, len(grid.order)
    if kind == "all_to_all":
        raise CollectiveError("algorithm 'tree' does not apply to all_to_all (use ring, direct, 2d or hier)")
    if kind == "broadcast":
        r, steps, k = order.index(root), [], 1
        while k < n:
            steps.append([Xfer(order[(r + q) % n], order[(r + q + k) % n], (0,), False) for q in range(k) if q + k < n])
            k *= 2
        return 1, steps
    if kind == "all_reduce":
        return 1, doubling_all_reduce(order, (0,))
    if n & (n - 1):
        raise CollectiveError(f"algorithm 'tree' {kind} needs a power-of-two group, got {n} members")
    bits = n.bit_length() - 1
    steps = []
    if kind == "reduce_scatter":
        for k in reversed(range(bits)):
            steps.append([Xfer(order[q], order[q ^ (1 << k)], tuple(sorted(
                order[x] for x in range(n) if x >> (k + 1) == q >> (k + 1) and (x >> k) & 1 != (q >> k) & 1)), True)
                for q in range(n)])
    else:
        for k in range(bits):
            steps.append([Xfer(order[q], order[q ^ (1 << k)], tuple(sorted(
                order[x] for x in range(n) if x >> k == q >> k)), False) for q in range(n)])
    return n, steps
