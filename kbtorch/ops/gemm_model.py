"""The analytic ideal-pipeline model of a GEMM, and the automatic tiling choice.

Per PE the pipeline runs at its slowest stage: compute (``flops / peak``), DMA (A and B
tiles read from its HBM slice at the bandwidth it gets: channels, slice port, and the
controller link shared with the other active slices on that controller; plus one request
round trip per tile, since a composite reads its tiles one after another), TCM (fetch bytes
over the TCM link); plus pipeline fill (the first tile's read and fetch), drain (the last
tile's store and write), the first command's issue, and for a K split the transfer and sum
of the partial results. The GEMM takes as long as its slowest PE.

The automatic choice enumerates PE grids (using all or a prefix of the PEs, with a K split
of up to 8) and macro-tiles that fit the TCM, ranks them by this model, and confirms the
best few by simulation.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..kernel.door import MulticastError, can_multicast, data_path, tree
from .contract import DTYPES
from .gemm_plan import GemmTiling, gangs, plan
from .layout import ACC_BYTES, tcm_budget
from .. import state

# NOTE: the search space of the automatic tiling (tile configs as data), not hardware.
TILE_MN = (64, 128, 256, 512)
TILE_K = (128, 256, 512, 1024, 2048)
MAX_SPLIT = 8
NEAR = 1.03
#: The automatic choice's grids use all, half or a quarter of the group's PEs.
GROUP_SHARES = (1, 2, 4)


@dataclass(frozen=True)
class GemmEstimate:
    """Analytic latency (ns) and its parts for the slowest PE."""

    ns: float
    compute_ns: float
    dma_ns: float
    tcm_ns: float
    overhead_ns: float
    bound: str


def multicast_gangs(machine, shards: list, tiling: GemmTiling) -> dict:
    """``{pe: (A gang, B gang)}`` of the operand tiles the kernel shares by multicast: the
    plan's gangs (``gemm_plan.gangs``), each cut into the parts whose trees, from every
    member's HBM to every member's TCM, split only at nodes with multicast (``multicast_parts``: a
    gang across the chips of a system shares inside each chip); empty on a machine without
    multicast."""
    if not machine.multicast_nodes:
        return {}

    def usable(gang, pe) -> tuple | None:
        return None if gang is None else _part_of(machine, gang).get(pe)

    out = {pe: (usable(a, pe), usable(b, pe)) for pe, (a, b) in gangs(shards, tiling).items()}
    return {pe: g for pe, g in out.items() if g != (None, None)}


@state.cache


@functools.lru_cache(maxsize=4096)
def multicast_parts(machine, gang: tuple) -> tuple:
    """``gang`` itself if it can multicast, else its parts that can: the members grouped by
    the outermost level of their names at which they differ (chips of a system, then
    clusters, ...), each group cut again; groups of one PE share nothing."""
    if _gang_ok(machine, gang):
        return (gang,)
    names = [machine.pes[p].prefix.rstrip(".").split(".") for p in gang]
    for depth in range(1, min(len(n) for n in names) + 1):
        groups: dict = {}
        for p, n in zip(gang, names):
            groups.setdefault(tuple(n[:depth]), []).append(p)
        if len(groups) > 1:
            return tuple(part for g in groups.values() if len(g) > 1 for part in multicast_parts(machine, tuple(g)))
    return ()


@state.cache


@functools.lru_cache(maxsize=4096)
def _part_of(machine, gang: tuple) -> dict:
    """``{pe: its part of multicast_parts}`` for the members of ``gang`` in a part."""
    return {pe: part for part in multicast_parts(machine, gang) for pe in part}


@state.cache


@functools.lru_cache(maxsize=4096)
def _gang_ok(machine, gang: tuple) -> bool:
    """Whether every member of ``gang`` can multicast from its HBM to all members' TCMs."""
    tcms = [machine.pes[p].node("tcm") for p in gang]
    try:
        return all(can_multicast(machine, tree([data_path(machine, machine.pes[p].hbm, d) for d in tcms]))
                   for p in gang)
    except MulticastError:
        return False


@state.cache


@functools.lru_cache(maxsize=1024)
def _sharing(machine, m: int, n: int, k: int, used: tuple, grid: tuple, tile_mn: tuple, partial: bool) -> tuple:
    """``({pe: (A gang size, B gang size)}, elements)``: the PEs that share operand tiles by
    multicast, and the operand elements the busiest NoC link carries over the whole GEMM
    divided by its GB/s (each tree link once per gang; unshared reads on their own path).
    NOTE: the K tile changes neither (``tile_mn``: the output tile), so the tilings that
    differ only in it share one answer."""
    tiling = GemmTiling(grid, (*tile_mn, 1), partial)
    shards = _plan(m, n, k, used, grid, partial)
    shared = multicast_gangs(machine, shards, tiling)
    tm, tn = tile_mn
    load: dict = {}
    done = set()
    for s in shards:
        mp, np_, kp = s.shape
        a_elems, b_elems = mp * kp * -(-np_ // tn), kp * np_ * -(-mp // tm)
        for gang, elems in zip(shared.get(s.pe, (None, None)), (a_elems, b_elems)):
            if gang is None:
                edges = _edges(machine, machine.pes[s.pe].hbm, (s.pe,))
            elif (gang, elems) in done:
                continue
            else:
                done.add((gang, elems))
                edges = _edges(machine, machine.pes[gang[0]].hbm, gang)
            for e in edges:
                load[e] = load.get(e, 0) + elems
    g = machine.graph
    worst = max((x / g.edges[e]["bw_gbps"] for e, x in load.items()), default=0.0)
    return {pe: (len(a) if a else 1, len(b) if b else 1) for pe, (a, b) in shared.items()}, worst


@state.cache


@functools.lru_cache(maxsize=64)
def _plan(m: int, n: int, k: int, used: tuple, grid: tuple, partial: bool) -> tuple:
    """``gemm_plan.plan`` of a grid (the tile does not change which PE gets which block)."""
    return tuple(plan(m, n, k, list(used), GemmTiling(grid, (1, 1, 1), partial)))


@state.cache


@functools.lru_cache(maxsize=4096)
def _edges(machine, hbm: str, pes: tuple) -> tuple:
    """The links of the tree (a path for one PE) from ``hbm`` into the TCMs of ``pes``."""
    return tuple(tree([data_path(machine, hbm, machine.pes[p].node("tcm")) for p in pes]).edges())


def _memory_gbps(machine, pe: int, active: dict) -> float:
    """HBM bandwidth (GB/s) of PE ``pe``'s part of its memory, whatever its port."""
    ctrl, own, up = machine.hbm_port(pe)
    return min(own, up / active[ctrl])


def _hbm_gbps(machine, pe: int, active: dict) -> float:
    """HBM bandwidth (GB/s) PE ``pe`` gets from its own slice with ``active`` slices per
    controller streaming."""
    ctrl, own, up = machine.hbm_port(pe)
    return min(own, up / active[ctrl], machine.port_gbps(pe, "dma_rd"))


def estimate(machine, m: int, n: int, k: int, dtype: str, pes: list, tiling: GemmTiling,
             out_dtype: str | None = None) -> GemmEstimate:
    """The ideal-pipeline latency of the GEMM under ``tiling`` (C in ``out_dtype``, default ``dtype``)."""
    used = tuple(pes[: tiling.grid[0] * tiling.grid[1] * tiling.grid[2]])
    eb, ob = DTYPES[dtype].bytes, DTYPES[out_dtype or dtype].bytes
    # the first composite's issue and the control overheads before it reaches its engine
    issue = machine.issue.kind_ps("composite", moves=3, stages=3) / 1000 + machine.control_ps(used[0]) / 1000
    worst = None
    sizes, link = _sharing(machine, m, n, k, used, tiling.grid, tiling.tile[:2], tiling.partial) \
        if machine.multicast_nodes else ({}, 0.0)
    classes = _shard_classes(machine, m, n, k, used, tiling.grid, tiling.partial, tuple(sorted(sizes.items())))
    for s, hbm, trip, mem in classes:
        est = _pe_estimate(machine, s, tiling, dtype, (eb, ob), hbm, trip, issue, sizes.get(s.pe), mem, link * eb)
        if worst is None or est.ns > worst.ns:
            worst = est
    return worst


@state.cache


@functools.lru_cache(maxsize=1024)
def _shard_classes(machine, m: int, n: int, k: int, used: tuple, grid: tuple, partial: bool,
                   gangs: tuple = ()) -> tuple:
    """One (shard, HBM GB/s, round trip ns, memory GB/s) per distinct kind of PE of the plan
    (the HBM GB/s through its port, the memory's alone): the tile size does not change which
    PE gets which block; ``gangs``: ``((pe, (A, B gang sizes)), ...)`` of PEs sharing tiles, which
    makes a kind of its own)."""
    shards = _plan(m, n, k, used, grid, partial)
    active: dict = {}
    for s in shards:
        ctrl = machine.hbm_port(s.pe)[0]
        active[ctrl] = active.get(ctrl, 0) + 1
    out, seen, gang = [], set(), dict(gangs)
    for s in shards:
        hbm, trip = _hbm_gbps(machine, s.pe, active), machine.read_trip_ns(s.pe)
        key = (s.shape, len(s.peers), hbm, trip, gang.get(s.pe))
        if key not in seen:
            seen.add(key)
            out.append((s, hbm, trip, _memory_gbps(machine, s.pe, active)))
    return tuple(out)


def _pe_estimate(machine, s, tiling: GemmTiling, dtype: str, sizes: tuple, hbm: float, trip: float,
                 issue: float, gang: tuple | None = None, mem: float = 0.0, link_ns: float = 0.0) -> GemmEstimate:
    """Pipeline time of one PE: every tile class at its slowest stage (``_steady_ns``), plus
    one tile through the other stages (fill and drain), the last output tile's store and
    write, and the first issue. ``gang``: the sizes of the gangs sharing its A and B tiles by
    multicast (this PE reads 1/size of them from HBM at ``mem`` GB/s, its part of the memory,
    and receives all through its port); ``link_ns``: the busiest NoC link's time for the
    operands (0: not modeled, as on a machine without multicast)."""
    g, info = machine.graph, machine.pes[s.pe]
    (eb, ob), (mp, np_, kp) = sizes, s.shape
    peak = machine.engine_tflops(s.pe, "gemm", DTYPES[dtype].rate) * 1000     # flop/ns
    tcm_gbps = g.edges[info.node("tcm"), info.node("gemm")]["bw_gbps"]
    tm, tn, tk = tiling.tile
    row_tiles, col_tiles = -(-mp // tm), -(-np_ // tn)
    n = row_tiles * col_tiles * -(-kp // tk)
    read = (mp * kp * col_tiles + kp * np_ * row_tiles) * eb
    share = None
    if gang is not None:
        # NOTE: HBM serves this PE's share of the reads at its part of the memory; the port
        # into its TCM takes every tile.
        share = (gang, mem, machine.port_gbps(s.pe, "dma_rd"))
        own = (mp * kp * col_tiles / gang[0] + kp * np_ * row_tiles / gang[1]) * eb
        dma = max(own / share[1], read / share[2]) + n * trip
    else:
        dma = read / hbm + n * trip
    stages = {"DMA": dma, "TCM": read / tcm_gbps, "compute": 2 * mp * np_ * kp / peak}
    if link_ns:
        stages["NoC"] = link_ns
    bound = max(stages, key=stages.get)
    fill = sum(v / n for k, v in stages.items() if k != bound)
    rows, cols = mp - (row_tiles - 1) * tm, np_ - (col_tiles - 1) * tn
    steady = _steady_ns(((tm, row_tiles - 1), (rows, 1)), ((tn, col_tiles - 1), (cols, 1)), kp, tk, eb,
                        hbm, tcm_gbps, peak, trip, share)
    steady = max(steady, link_ns)
    last = rows * cols * (ACC_BYTES if len(s.peers) > 1 else ob)
    overhead = issue + fill + last / tcm_gbps + last / hbm + trip / 2
    if len(s.peers) > 1:
        # the other partials into the owner's TCM (through its one port), its IPCQ, the
        # sum on MATH (fp32), C out: three trips
        math = machine.engine_tflops(s.pe, "math", "fp32") * 1000
        ingress = machine.port_gbps(s.pe, "dma_rd")
        others = len(s.peers) - 1
        overhead += others * mp * np_ * ACC_BYTES / ingress + others * mp * np_ / math + 3 * trip + 3 * issue
    return GemmEstimate(steady + overhead, stages["compute"], stages["DMA"], stages["TCM"], overhead, bound)


def _steady_ns(row_classes, col_classes, kp: int, tk: int, eb: int, hbm: float, tcm: float, peak: float,
               trip: float, share=None) -> float:
    """Pipelined time of all K steps: each class of tiles (full or edge rows x full or edge
    columns, full or short K step) runs at its own slowest stage (``share``: ((A gang, B
    gang), HBM GB/s, port GB/s) of a PE sharing its tiles by multicast)."""
    total = 0.0
    k_classes = ((tk, kp // tk), (kp % tk, 1))
    for rows, nr in row_classes:
        for cols, nc in col_classes:
            for depth, nk in k_classes:
                if nr * nc * nk == 0 or rows * cols * depth == 0:
                    continue
                tile = (rows * depth + depth * cols) * eb
                if share is None:
                    dma = tile / hbm + trip
                else:
                    (ka, kb), mem, port = share
                    dma = max((rows * depth / ka + depth * cols / kb) * eb / mem, tile / port) + trip
                step = max(dma, tile / tcm, 2 * rows * cols * depth / peak)
                total += nr * nc * nk * step
    return total


def _grids(p: int, m: int, n: int, k: int):
    for used in sorted({p // s for s in GROUP_SHARES} - {0}, reverse=True):
        for gk in (1, 2, 4, 8):
            if used % gk or gk > MAX_SPLIT or gk > k:
                continue
            rest = used // gk
            for gm in range(1, rest + 1):
                if rest % gm == 0 and gm <= m and rest // gm <= n:
                    yield gm, rest // gm, gk


def fit_counts(total: int) -> list[int]:
    """Group sizes to try, largest first, for a shape too small for ``total`` PEs: the
    group, then its smallest share, and so on down to one PE; with the shares each size's
    grids use (``GROUP_SHARES``), every size is tried."""
    out = [total]
    while out[-1] > 1:
        out.append(max(1, out[-1] // GROUP_SHARES[-1]))
    return out


def candidates(machine, m: int, n: int, k: int, dtype: str, pes: list, out_dtype: str | None = None):
    """(estimate, tiling) of every tiling that fits the TCM, best first."""
    cap = tcm_budget(machine, pes[0])
    out = []
    for grid in _grids(len(pes), m, n, k):
        bm, bn, bk = -(-m // grid[0]), -(-n // grid[1]), -(-k // grid[2])
        for tm in sorted({min(t, bm) for t in TILE_MN}):
            for tn in sorted({min(t, bn) for t in TILE_MN}):
                for tk in sorted({min(t, bk) for t in TILE_K}):
                    tiling = GemmTiling(grid, (tm, tn, tk))
                    if _tcm_need(bm, bn, grid[2], tiling, dtype) > cap:
                        continue
                    out.append((estimate(machine, m, n, k, dtype, pes, tiling, out_dtype), tiling))
    return rank(out)


def rank(cands: list) -> list:
    """Best first: by estimate; within ``NEAR`` of the best, fewer and larger tiles first
    (less per-tile overhead than the model sees, and a cheaper simulation), then no K split."""
    if not cands:
        return cands
    cands.sort(key=lambda e: e[0].ns)
    best = cands[0][0].ns
    near = [c for c in cands if c[0].ns <= NEAR * best]
    near.sort(key=lambda e: (-e[1].tile[0] * e[1].tile[1] * e[1].tile[2], e[1].grid[2], e[0].ns))
    return near + cands[len(near):]


def _tcm_need(bm: int, bn: int, gk: int, tiling: GemmTiling, dtype: str) -> int:
    tm, tn, tk = tiling.tile
    eb = DTYPES[dtype].bytes
    staging = 2 * ((tm * tk + tk * tn) * eb + tm * tn * ACC_BYTES)
    return staging + (gk * bm * bn * ACC_BYTES if gk > 1 else 0)
