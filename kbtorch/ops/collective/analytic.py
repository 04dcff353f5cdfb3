"""Analytic models of a collective, reported next to the simulated time.

- ``resource_ps`` (through the door, ``kernel.door.resource_ps``): the busy time every resource would
  need for the kernel's own traffic (each link: flits x flit time; each HBM slice: bursts
  x burst time / channels; each GEMM/MATH engine: its compute; each control processor:
  the issue cost of its commands).
- ``startup_ps`` (alpha_min): the longest chain of one-flit transfers that an output
  block depends on, each from the sender's TCM or HBM (whichever is faster) to the
  receiver (its TCM for a reduction, then fetch, one MATH element and store; its HBM for a
  copy, and for a reduction on a sprayed machine, then into its TCM:
  ``kernel_layout.sprayed_reductions``) and, for the rest of one packet, its slowest link's flit time; each transfer
  also waits for the command that carries it: a member's
  control processor issues commands one at a time (``d_cmd`` of the smallest descriptor
  each): a composite for every step in which it reduces, and a DMA for every step in
  which it sends what no composite of its own can carry (a reduction before it has
  reduced anything, a copy of blocks it did not reduce itself: ``_own_command``); plus the
  launch (CP and scheduler overhead). No kernel can do it faster.
- ``bound`` = max(alpha_min, the busiest resource): the speed of light of this kernel on
  this topology; ``pct_bound`` compares the simulation with it.
- ``alpha_beta_ps``: the textbook estimate, step by step without overlap: each step costs
  its alpha plus its bytes over the step's bottleneck link (the most loaded link of the
  step's transfers, HBM reads included, divided by its bandwidth); and never less than the
  time the busiest control processor needs to issue the kernel's commands.
  Both know the machine's mechanisms: a sprayed transfer (``[routing]`` policy other than
  ``single``) loads each of its paths by its share and streams at their summed bandwidth;
  copies of one packet to several receivers that the kernel sends as one multicast
  (``multicast.multicast_copies``) load each link of their tree once. So
  ``algo="auto"`` prefers ``direct`` all-gathers and broadcasts where multicast makes their
  copies one, and weighs algorithms by the bandwidth of all paths where packets are sprayed
  (adaptively sprayed ones split where the step's other traffic leaves room: ``spread``).
"""
from __future__ import annotations

from collections import Counter

from ...kernel.door import data_path, data_paths, resource_ps, spread, tree  # noqa: F401 (resource_ps: one of its models)
from .kernel_layout import sprayed_reductions
from .multicast import tree_ok


def describe(resource) -> str:
    return "->".join(resource) if isinstance(resource, tuple) else resource


def _head_ps(machine, path: tuple) -> int:
    """Uncontended time of one flit along ``path`` (links and the nodes they enter)."""
    g = machine.graph
    return sum(g.edges[u, v]["flit_ps"] + g.edges[u, v]["prop_ps"] + g.nodes[v]["overhead_ps"] for u, v in zip(path, path[1:]))


def _landing(d, reduce: bool, sprayed: bool) -> str:
    """Where a transfer's packet lands at receiver ``d`` (PE info): a copy in its HBM, a
    reduction in its TCM receive slots, or its HBM ones (``sprayed``: the group's
    ``sprayed_reductions``)."""
    return d.node("tcm") if reduce and not sprayed else d.hbm


def _xfer_alpha(machine, src_pe: int, dst_pe: int, reduce: bool, sprayed: bool, src: str | None = None) -> int:
    """One flit of a transfer, from the sender's TCM (or memory node ``src``) to the receiver
    (see the docstring)."""
    s, d = machine.pes[src_pe], machine.pes[dst_pe]
    tcm = d.node("tcm")
    end = _landing(d, reduce, sprayed)
    t = _head_ps(machine, data_path(machine, src or s.node("tcm"), end))
    if reduce:
        if end != tcm:
            t += _head_ps(machine, data_path(machine, end, tcm))
        math = d.node("math")
        t += _head_ps(machine, (tcm, math)) + _head_ps(machine, (math, tcm)) + 1
    return t


def _xfer_beta(machine, src_pe: int, dst_pe: int, reduce: bool, sprayed: bool, src: str | None = None) -> int:
    """The flit time (ps) of the slowest link on a transfer's data path (from the sender's
    TCM, or memory node ``src``)."""
    s, d = machine.pes[src_pe], machine.pes[dst_pe]
    src, dst = src or s.node("tcm"), _landing(d, reduce, sprayed)
    if machine.multipath:
        # NOTE: a sprayed packet streams over all its paths at once: their summed bandwidth.
        paths = data_paths(machine, src, dst)
        if len(paths) > 1:
            return max(1, round(machine.flit_bytes * 1000 / sum(w for _, w in paths)))
    path = data_path(machine, src, dst)
    g = machine.graph
    return max(g.edges[u, v]["flit_ps"] for u, v in zip(path, path[1:]))


def step_alphas(machine, sched, pes: tuple) -> list[int]:
    """alpha (ps) of each step: its slowest transfer's one-flit latency."""
    cache: dict = {}
    out = []
    sprayed = sprayed_reductions(machine, pes)
    for step in sched.steps:
        worst = 0
        for x in step:
            key = (pes[x.src], pes[x.dst], x.reduce, sprayed)
            if key not in cache:
                cache[key] = _xfer_alpha(machine, *key)
            worst = max(worst, cache[key])
        out.append(worst)
    return out


def program_start_ps(machine, pe: int) -> int:
    """The CP's and scheduler's start of PE ``pe``'s program and its first command's issue
    (not the kernel launch that reaches it: ``Machine.launch_ps``)."""
    return machine.control_ps(pe) + machine.issue.kind_ps("dma")


def _fastest_ps(machine, src_pe: int, dst_pe: int, reduce: bool, sprayed: bool, tail: int) -> int:
    """A transfer's first flit plus ``tail`` more through its slowest link, from whichever of
    the sender's TCM and HBM is faster. NOTE: on a die-wide HBM a copy from the sender's HBM
    does not cross its tile's NoC link (maia200: 8 tiles' 64 KiB ring broadcast in 1.30 us
    against a 1.99 us bound from TCM)."""
    s = machine.pes[src_pe]
    return min(_xfer_alpha(machine, src_pe, dst_pe, reduce, sprayed, src)
               + tail * _xfer_beta(machine, src_pe, dst_pe, reduce, sprayed, src) for src in (s.node("tcm"), s.hbm))


def _own_command(x, reduced: set, mine: list) -> bool:
    """Whether transfer ``x`` needs a DMA command of its sender's own: a reduction sent before
    the sender has reduced anything, or a copy of blocks whose values the sender did not all
    make with a composite of its own (``mine``: its input, or values that came to it as
    copies). The others ride in the composite that made their values (fused forward and
    fused copy)."""
    if x.reduce:
        return x.src not in reduced
    return not set(x.blocks) <= mine[x.src]


def startup_ps(machine, sched, pes: tuple, packet_bytes: int = 0) -> int:
    """alpha_min (see the module docstring): the longest chain of transfers any output
    block depends on, each its first flit's latency plus, when ``packet_bytes`` is given,
    the rest of one packet through the slowest link of its path (a receiver handles a
    packet once all of it has landed); a transfer also waits for the command that carries
    it to be issued (a member's first sends, before it has reduced anything, are its own
    DMA commands; a reduction is its receiver's command of that step), at one command issue
    per step for each of its reductions (a composite) and its sends that need their own
    DMA (``_own_command``), counted from the member's kernel launch (``Machine.launch_ps``);
    plus the program's start on its control processor."""
    cache: dict = {}
    cmd = machine.issue.kind_ps("dma")
    start_of = [machine.launch_ps(pe) for pe in pes]
    # NOTE: a reduction needs a MATH composite of at least FETCH, compute and STORE (three
    # stages; the three as simple commands would cost three issues).
    reduce_cmd = machine.issue.kind_ps("composite", stages=3)
    tail = max(0, -(-packet_bytes // machine.flit_bytes) - 1)
    ready = [{b: start_of[m] for b in sched.holds[m]} for m in range(sched.n)]
    busy, reduced = [0] * sched.n, set()
    mine = [set() for _ in range(sched.n)]      # blocks whose value a member holds from its own composite
    sprayed = sprayed_reductions(machine, pes)
    for step in sched.steps:
        reducers = {x.dst for x in step if x.reduce}
        own = {x.src for x in step if _own_command(x, reduced, mine)}
        before = list(busy)
        for m in reducers | own:
            busy[m] += (m in reducers) + (m in own)
        new = [dict(r) for r in ready]
        for x in step:
            key = (pes[x.src], pes[x.dst], x.reduce, sprayed)
            if key not in cache:
                cache[key] = _fastest_ps(machine, *key, tail)
            start = max(ready[x.src][b] for b in x.blocks)
            if x.src not in reduced:
                # NOTE: the send's own DMA is the first command of the member's step.
                start = max(start, start_of[x.src] + (before[x.src] + 1) * cmd)
            arrive = start + cache[key]
            if x.reduce:
                arrive = max(arrive, start_of[x.dst] + (busy[x.dst] - 1) * cmd + reduce_cmd)
            for b in x.blocks:
                new[x.dst][b] = max(new[x.dst].get(b, 0), arrive) if x.reduce else arrive
        reduced |= reducers
        for x in step:
            if x.reduce:
                mine[x.dst].update(x.blocks)
            else:
                mine[x.dst].difference_update(x.blocks)
        ready = new
    chain = max(ready[m][b] for m in range(sched.n) for b in sched.keeps[m])
    return machine.control_ps(pes[0]) + max(chain, max(t + n * cmd for t, n in zip(start_of, busy)))


def issue_ps(machine, sched, block_bytes: int, packet_bytes: int) -> int:
    """Issue time of the busiest member's commands, counted from the schedule the way the
    kernel issues them: one composite per packet it reduces, one DMA per packet it copies
    out or sends before having reduced anything (later reduce sends ride in composites).
    A packet is a piece of a block, or up to ``packet_bytes // block_bytes`` blocks of one
    transfer (counted as if a transfer's blocks were always side by side: a floor)."""
    def packets(nb: int) -> int:
        if packet_bytes >= block_bytes:
            return -(-nb // (packet_bytes // block_bytes))
        return nb * -(-block_bytes // packet_bytes)

    count = [0] * sched.n
    reduced = [False] * sched.n
    for step in sched.steps:
        for x in step:
            if not x.reduce or not reduced[x.src]:
                count[x.src] += packets(len(x.blocks))
        for x in step:
            if x.reduce:
                count[x.dst] += packets(len(x.blocks))
                reduced[x.dst] = True
    # NOTE: each command counted as a composite of two moves whose stages are not counted (a floor).
    return max(count) * machine.issue.kind_ps("composite", moves=2)


def alpha_beta_ps(machine, sched, pes: tuple, block_bytes: int, packet_bytes: int) -> int:
    """Step-synchronous alpha-beta estimate (see the module docstring)."""
    alphas = step_alphas(machine, sched, pes)
    total = program_start_ps(machine, pes[0])
    fb = machine.flit_bytes
    g = machine.graph
    cache: dict = {}
    worst: dict = {}       # a step's transfers (pairs and block counts) -> its most loaded link
    lands_hbm = sprayed_reductions(machine, pes)
    for step, alpha in zip(sched.steps, alphas):
        sig = tuple((x.src, x.dst, x.reduce, len(x.blocks)) for x in step)
        if sig not in worst:
            loads: Counter = Counter()
            sprayed = []
            for group in _groups(machine, pes, step):
                x = group[0]
                n = max(1, -(-len(x.blocks) * block_bytes // fb))
                if len(group) > 1:
                    edges = _tree_edges(machine, pes[x.src], tuple(pes[y.dst] for y in group))
                else:
                    key = (pes[x.src], pes[x.dst], x.reduce, lands_hbm)
                    if key not in cache:
                        cache[key] = _xfer_edges(machine, *key)
                    edges, paths = cache[key]
                    if paths is not None:
                        sprayed.append((paths, n))
                for e, ps in edges:
                    loads[e] += n * ps
            spread(machine, loads, sprayed)
            worst[sig] = round(max(loads.values())) if loads else 0
        total += alpha + worst[sig]
    return max(total, issue_ps(machine, sched, block_bytes, packet_bytes))


def _groups(machine, pes: tuple, step) -> list:
    """A step's transfers as the kernel sends them: copies of the same blocks from the same
    member that one multicast tree reaches form one group (a machine with multicast)."""
    if not machine.multicast_nodes:
        return [[x] for x in step]
    groups, at = [], {}
    for x in step:
        key = None if x.reduce else (x.src, tuple(x.blocks))
        if key is not None and key in at:
            groups[at[key]].append(x)
            continue
        if key is not None:
            at[key] = len(groups)
        groups.append([x])
    out = []
    for g in groups:
        if len(g) > 1 and not tree_ok(machine, pes[g[0].src], tuple(pes[y.dst] for y in g)):
            out.extend([y] for y in g)
        else:
            out.append(g)
    return out


def _tree_edges(machine, src: int, dsts: tuple) -> list:
    """(link, flit ps) of the multicast tree from PE ``src``'s HBM to the HBMs of ``dsts``."""
    g = machine.graph
    root = tree([data_path(machine, machine.pes[src].hbm, machine.pes[d].hbm) for d in dsts])
    return [(e, g.edges[e]["flit_ps"]) for e in root.edges()]


def _xfer_edges(machine, src: int, dst: int, reduce: bool, sprayed: bool) -> tuple:
    """((link, flit ps), ...) of one transfer: its data path (a sprayed one: each path's
    links at its share of the packets) and, for a reduction, the receiver's read of its own
    value; and the paths of an adaptively sprayed one (then left out of the edges: the
    step's ``resources.spread`` splits it), else None."""
    g = machine.graph
    s, d = machine.pes[src], machine.pes[dst]
    end = _landing(d, reduce, sprayed)
    own = data_path(machine, d.hbm, d.node("tcm")) if reduce else ()
    out = [(e, g.edges[e]["flit_ps"]) for e in zip(own, own[1:])]
    if reduce and end == d.hbm:
        out *= 2        # NOTE: the landed packet is read into TCM as the own value is
    if machine.multipath:
        paths = data_paths(machine, s.hbm, end)
        if machine.routing.adaptive and len(paths) > 1:
            return out, tuple(p for p, _ in paths)
        total = sum(w for _, w in paths)
        return [(e, g.edges[e]["flit_ps"] * w / total) for p, w in paths for e in zip(p, p[1:])] + out, None
    path = data_path(machine, s.hbm, end)
    return [(e, g.edges[e]["flit_ps"]) for e in zip(path, path[1:])] + out, None
