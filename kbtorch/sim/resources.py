"""Busy time per resource of a set of programs, without simulating them.

``resource_ps`` adds up what every resource would need for the programs' own traffic: each
link flits x flit time; each HBM/SRAM slice bursts x burst time / channels; each GEMM/MATH
engine its compute; each control processor the issue cost of its commands. The busiest
resource is a lower bound on any run of the programs (``ops.collective.analytic`` reports it).
"""
from __future__ import annotations

import functools
from collections import Counter

from .commands import Composite, Compute, Dma, Fetch, Multicast, Send, Store
from .components.dma import data_path, data_paths
from .multicast import tree
from .registry import Registry

#: What each command type loads: ``handler(load, info, cmd)`` adds its traffic to ``load``
#: (a ``_Load``; ``info``: the issuing PE). Every command also costs its issue.
LOAD = Registry("resource load")


class _Load:
    """The traffic of one ``resource_ps`` call, gathered command by command."""

    def __init__(self, machine):
        self.machine = machine
        self.pairs: Counter = Counter()     # (src memory, dst memory) -> flits moved by DMA
        self.local: Counter = Counter()     # an engine's TCM link -> flits fetched or stored
        self.trees: Counter = Counter()     # (src memory, dst memories) -> flits multicast
        self.busy: Counter = Counter()
        fb = machine.flit_bytes
        self.flits = lambda n: max(1, -(-n // fb))
        self.issue = functools.cache(machine.issue.cmd_ps)
        self.compute = functools.cache(lambda eng, flops, dtype: _compute_ps(machine, eng, flops, dtype))


@LOAD.register(Dma)
def _dma(load: _Load, info, c) -> None:
    load.pairs[(c.src.node, c.dst.node)] += load.flits(c.nbytes)


@LOAD.register(Multicast)
def _multicast(load: _Load, info, c) -> None:
    if c.unicast:
        for d in c.dsts:
            load.pairs[(c.src.node, d.node)] += load.flits(c.nbytes)
        return
    load.trees[(c.src.node, tuple(d.node for d in c.dsts))] += load.flits(c.nbytes)


@LOAD.register(Composite)
def _composite(load: _Load, info, c) -> None:
    tcm, flits = info.node("tcm"), load.flits
    for mv in c.reads:
        if mv.share is not None:
            # NOTE: a shared read's tile i is multicast once, by member i % gang size.
            k, j = len(mv.share.pes), mv.share.pes.index(info.id)
            mine = len(range(j, c.tiles, k))
            if mine:
                dsts = tuple(load.machine.pes[p].node("tcm") for p in mv.share.pes)
                load.trees[(mv.loc.node, dsts)] += mine * flits(mv.nbytes)
            continue
        load.pairs[(mv.loc.node, tcm)] += c.tiles * flits(mv.nbytes)
    writes = c.tiles if c.accumulate == 1 else sum(1 for i in range(c.tiles) if c.stores_after(i))
    for mv in c.writes:
        load.pairs[(tcm, mv.loc.node)] += writes * flits(mv.nbytes)
    eng = info.node(c.engine)
    if c.fetch_bytes:
        load.local[(tcm, eng)] += c.tiles * flits(c.fetch_bytes)
    if c.store_bytes:
        load.local[(eng, tcm)] += writes * flits(c.store_bytes)
    load.busy[eng] += c.tiles * load.compute(eng, c.flops, c.dtype)


@LOAD.register(Compute)
def _compute(load: _Load, info, c) -> None:
    eng = info.node(c.engine)
    load.busy[eng] += load.compute(eng, c.flops, c.dtype)


@LOAD.register(Send)
def _send(load: _Load, info, c) -> None:
    load.pairs[(info.node("ipcq"), load.machine.pes[c.dst_pe].node("ipcq"))] += load.flits(c.nbytes)


@LOAD.register(Fetch, Store)
def _issue_only(load: _Load, info, c) -> None:
    """NOTE: a simple fetch or store counts its issue only (its TCM link is not added up),
    as the model always did; composites count their fetches and stores."""


def resource_ps(machine, programs: dict) -> Counter:
    """Busy picoseconds per resource (link tuples, memory and engine node names, ``cp PE``)."""
    load = _Load(machine)
    busy = load.busy
    for pe, cmds in programs.items():
        info = machine.pes[pe]
        cp = f"cp PE {pe}"
        for c in cmds:
            busy[cp] += load.issue(c.descriptor(machine.issue))
            LOAD[type(c)](load, info, c)
    for link, n in load.local.items():
        _path_load(machine, busy, link, n)
    g = machine.graph
    adaptive = []
    for (src, dst), n in load.pairs.items():
        if g.nodes[src]["kind"] == "ipcq" or not machine.multipath:
            path = machine.route(src, dst) if g.nodes[src]["kind"] == "ipcq" else data_path(machine, src, dst)
            _path_load(machine, busy, path, n)
        else:
            # NOTE: a sprayed transfer loads each of its paths by its share of the packets
            # (adaptive spraying: split where the load is least, once the rest is known).
            paths = data_paths(machine, src, dst)
            if machine.routing.adaptive and len(paths) > 1:
                adaptive.append((tuple(p for p, _ in paths), n))
            else:
                total = sum(w for _, w in paths)
                for path, w in paths:
                    _path_load(machine, busy, path, n * w / total)
        for node in (src, dst):
            _memory_load(g, busy, node, n)
    for (src, dsts), n in load.trees.items():
        root = tree([data_path(machine, src, d) for d in dsts])
        for u, v in root.edges():
            busy[(u, v)] += n * g.edges[u, v]["flit_ps"]
        for node in (src,) + dsts:
            _memory_load(g, busy, node, n)
    spread(machine, busy, adaptive)
    return busy


#: Rounds of ``spread``'s greedy split of an adaptively sprayed transfer.
SPREAD_ROUNDS = 16


def spread(machine, loads: Counter, sprayed: list) -> None:
    """Add adaptively sprayed transfers (``(paths, flits)``) to the link ``loads`` (ps).

    NOTE: greedy water-filling, as adaptive packets go where the traffic is lightest: in
    ``SPREAD_ROUNDS`` rounds each transfer puts a share of its flits on the path whose most
    loaded link of its own (one not every path of the transfer crosses) would be least
    loaded after it (ties: the first path); links every path crosses take all its flits."""
    if not sprayed:
        return
    g = machine.graph
    touched = set()
    plans = []
    for paths, flits in sprayed:
        edges = [list(zip(p, p[1:])) for p in paths]
        common = set.intersection(*(set(es) for es in edges))
        plans.append(([[(e, g.edges[e]["flit_ps"]) for e in es if e not in common] for es in edges],
                      [(e, g.edges[e]["flit_ps"]) for e in common], flits / SPREAD_ROUNDS))
        touched.update(e for es in edges for e in es)
    for _ in range(SPREAD_ROUNDS):
        for own, common, part in plans:
            best = min(own, key=lambda es: max((loads[e] + part * ps for e, ps in es), default=0))
            for e, ps in best + common:
                loads[e] += part * ps
    for e in touched:
        loads[e] = round(loads[e])


def _memory_load(g, busy: Counter, node: str, n: int) -> None:
    p = g.nodes[node]
    if p["kind"] in ("hbm", "sram"):
        burst_ps = round(p["params"]["burst_bytes"] * 1000 / p["params"]["channel_gbps"])
        busy[node] += n * burst_ps // p["params"].get("channels", 1)


def _path_load(machine, loads: Counter, path: tuple, flits: int) -> None:
    g = machine.graph
    for u, v in zip(path, path[1:]):
        loads[(u, v)] += round(flits * g.edges[u, v]["flit_ps"])


def _compute_ps(machine, engine: str, flops: int, dtype: str) -> int:
    rate = machine.node(engine)["params"].get("tflops", {}).get(dtype)
    return round(flops / rate) if rate else 0
