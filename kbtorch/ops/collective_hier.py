"""The multi-dimensional and hierarchical collective algorithms (``2d`` and ``hier`` of
``collective_plan``, whose docstring describes them), and the phases only they use:
reduce-scatter/all-gather inside one line by halving/doubling (``_line_rs_ag``), the direct
all-gather along grid lines (``_dims_direct_ag``), the hierarchical all-reduce inside chips
then across them (``_chip_hierarchical``) and all-to-all one grid dimension at a time
(``_a2a_dims``)."""
from __future__ import annotations

from .collective_schedule import Xfer, _chain, _doubling_all_reduce, _merge, _relabel, _ring_ag, _ring_rs


def _a2a_dims(grid, groups: list) -> tuple[int, list]:
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


def multi_dim(kind: str, grid, root: int) -> tuple[int, list]:
    """Reduce-scatter along each grid dimension in turn, all-gather back in reverse."""
    n = len(grid.order)
    if kind == "all_to_all":
        return _a2a_dims(grid, [[j] for j in range(len(grid.dims))])
    if kind == "broadcast":
        steps, have = [], {root}
        for j in range(len(grid.dims)):
            phase = [_chain(line, line.index(m), (0,)) for m in sorted(have) for line in [grid.line(m, j)]]
            steps += _merge(*phase)
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
            phase.append(_ring_rs(list(line), lambda p, line=line, part=part: part[line[p]]))
        rs_steps += _merge(*phase)
        sets.append((rings, new))
        resp = new
    ag_steps = []
    for rings, part in reversed(sets):
        ag_steps += _merge(*[_ring_ag(list(line), lambda p, line=line: part[line[p]]) for line in sorted(rings)])
    steps = (rs_steps if kind != "all_gather" else []) + (ag_steps if kind != "reduce_scatter" else [])
    if kind == "all_reduce":
        steps = _relabel(steps, sorted(range(n), key=lambda b: grid.coords[b]))
    return n, steps


def _line_rs_ag(line: list) -> tuple[list, list]:
    """(reduce-scatter, all-gather) inside ``line``, block ``i`` ending at position ``i``:
    recursive halving/doubling when its length is a power of two, else the ring."""
    n = len(line)
    if n & (n - 1):
        own = lambda p: (p,)  # noqa: E731
        return _ring_rs(line, own), _ring_ag(line, own)
    bits = n.bit_length() - 1
    rs = [[Xfer(line[q], line[q ^ (1 << k)], tuple(x for x in range(n) if x >> (k + 1) == q >> (k + 1)
                                                   and (x >> k) & 1 != (q >> k) & 1), True) for q in range(n)]
          for k in reversed(range(bits))]
    ag = [[Xfer(line[q], line[q ^ (1 << k)], tuple(x for x in range(n) if x >> k == q >> k), False)
           for q in range(n)] for k in range(bits)]
    return rs, ag


def hierarchical(kind: str, grid, root: int) -> tuple[int, list]:
    """All-reduce in three phases around the grid's innermost dimension (the PEs of a CUBE
    on AHBM): reduce-scatter inside each line of it (block ``i`` to position ``i``), then an
    all-reduce of block ``i`` by recursive doubling among the members at position ``i``
    (snake order), then all-gather back inside each line. Only a line's share of the data
    crosses between lines. Between chips (``grid.inner == 0``): an all-gather is
    ``_dims_direct_ag``, a reduce-scatter the same backwards, an all-reduce both.
    Other kinds, and one-dimensional groups, as ``2d``."""
    inner = grid.inner
    if kind in ("all_gather", "all_reduce", "reduce_scatter") and len(grid.dims) > 1 and grid.inner == 0:
        # NOTE: between chips only (no grid dimension inside a chip); inside a chip as 2d.
        ag = _dims_direct_ag(grid)
        if kind == "all_gather":
            return len(grid.order), ag
        # the reduce-scatter is the all-gather run backwards: each transfer sends the partial
        # sum of the members its copy reached, the receiver adds it (so each link carries
        # the all-gather's blocks, the other way)
        rs = [[Xfer(x.dst, x.src, x.blocks, True) for x in step] for step in reversed(ag)]
        return len(grid.order), rs + (ag if kind == "all_reduce" else [])
    if kind == "all_to_all" and len(grid.dims) > 1:
        return _a2a_dims(grid, [list(range(inner)), list(range(inner, len(grid.dims)))])
    if kind != "all_reduce" or len(grid.dims) < 2 or inner == len(grid.dims):
        return multi_dim(kind, grid, root)
    if inner > 1:
        return _chip_hierarchical(grid, inner)
    n0 = grid.dims[0]
    lines = sorted({tuple(grid.line(m, 0)) for m in range(len(grid.order))})
    phases = [_line_rs_ag(list(line)) for line in lines]
    outer = [_doubling_all_reduce([m for m in grid.order if grid.coords[m][0] == c], (c,)) for c in range(n0)]
    return n0, _merge(*(rs for rs, _ in phases)) + _merge(*outer) + _merge(*(ag for _, ag in phases))


def _dims_direct_ag(grid) -> list:
    """All-gather by direct sends along the grid's lines, outer dimensions first: at step 0
    every member sends its block to every member of each of its lines; a block that arrived
    along dimension ``j`` goes on to the member's line of each dimension below ``j`` at the
    next step. Each block reaches each member once, by the dimension-ordered path (``len(dims)``
    steps); every link of a member carries blocks it needs itself, so a system of chips uses
    its tray links and its switch ports at once (direct sends every cross-tray block over the
    switch; ring and 2d send one block at a time)."""
    n, dims = len(grid.order), len(grid.dims)
    steps, fresh = [], [{j: (m,) for j in range(dims)} for m in range(n)]
    while any(fresh):
        step, nxt = [], [{} for _ in range(n)]
        for m in range(n):
            for j, blocks in sorted(fresh[m].items()):
                for d in grid.line(m, j):
                    if d != m:
                        step.append(Xfer(m, d, blocks, False))
                        for k in range(j):
                            nxt[d][k] = tuple(sorted(nxt[d].get(k, ()) + blocks))
        steps.append(step)
        fresh = nxt
    return steps


def _chip_hierarchical(grid, inner: int) -> tuple[int, list]:
    """``hier`` all-reduce with the first ``inner`` grid dimensions inside one unit (a chip):
    reduce-scatter inside each unit (its members in snake order), recursive doubling of
    share ``i`` among the members at position ``i`` of every unit, all-gather back."""
    units: dict = {}
    for m in grid.order:
        units.setdefault(grid.coords[m][inner:], []).append(m)
    lines = list(units.values())
    phases = [_line_rs_ag(line) for line in lines]
    outer = [_doubling_all_reduce([line[i] for line in lines], (i,)) for i in range(len(lines[0]))]
    return len(lines[0]), _merge(*(rs for rs, _ in phases)) + _merge(*outer) + _merge(*(ag for _, ag in phases))
