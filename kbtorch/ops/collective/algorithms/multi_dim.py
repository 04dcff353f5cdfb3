"""``2d``: the multi-dimensional ring: reduce-scatter along each dimension of the group's grid
in turn (the data shrinks by that dimension's size each time), all-gather back in reverse
order; with one dimension it is the ring. An all-to-all is one direct phase per grid
dimension (``a2a_dims``), each block moving along one dimension at a time, so a member
talks only to the members of its lines."""
from __future__ import annotations

from ..steps import Xfer, chain, merge, relabel, ring_ag, ring_rs
from .registry import algorithm


def a2a_dims(grid, groups: list) -> tuple[int, list]:
    """One direct phase per group of grid dimensions: a block moves to the member whose
    coordinates along those dimensions are its destination's."""
    n = len(grid.order)
    at = {c: m for m, c in enumerate(grid.coords)}
    where = {s * n + d: s for s in range(n) for d in range(n)}
    steps = []
    for dims in groups:
        moves: dict = {}
        for b, m in where.items():
            c, t = list(grid.coords[m]), grid.coords[b % n]
            for j in dims:
                c[j] = t[j]
            dst = at[tuple(c)]
            if dst != m:
                moves.setdefault((m, dst), []).append(b)
                where[b] = dst
        steps.append([Xfer(s, d, tuple(sorted(bs)), False) for (s, d), bs in sorted(moves.items())])
    return n * n, steps


@algorithm("2d", rank=2)
def multi_dim(kind: str, grid, root: int) -> tuple[int, list]:
    """Reduce-scatter along each grid dimension in turn, all-gather back in reverse."""
    n = len(grid.order)
    if kind == "all_to_all":
        return a2a_dims(grid, [[j] for j in range(len(grid.dims))])
    if kind == "broadcast":
        steps, have = [], {root}
        for j in range(len(grid.dims)):
            phase = [chain(line, line.index(m), (0,)) for m in sorted(have) for line in [grid.line(m, j)]]
            steps += merge(*phase)
            have = {x for m in have for x in grid.line(m, j)}
        return 1, steps
    resp = {m: tuple(range(n)) for m in range(n)}
    sets = []
    rs_steps = []
    for j in range(len(grid.dims)):
        rings = {tuple(grid.line(m, j)) for m in range(n)}
        new = {}
        phase = []
        for line in sorted(rings):
            part = {m: tuple(b for b in resp[m] if grid.coords[b][j] == grid.coords[m][j]) for m in line}
            new.update(part)
            phase.append(ring_rs(list(line), lambda p, line=line, part=part: part[line[p]]))
        rs_steps += merge(*phase)
        sets.append((rings, new))
        resp = new
    ag_steps = []
    for rings, part in reversed(sets):
        ag_steps += merge(*[ring_ag(list(line), lambda p, line=line: part[line[p]]) for line in sorted(rings)])
    steps = (rs_steps if kind != "all_gather" else []) + (ag_steps if kind != "reduce_scatter" else [])
    if kind == "all_reduce":
        steps = relabel(steps, sorted(range(n), key=lambda b: grid.coords[b]))
    return n, steps
