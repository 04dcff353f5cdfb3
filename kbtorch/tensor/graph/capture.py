"""Graph mode: ``with kbtorch.graph() as g:`` records the ops an eager program dispatches
once; ``g.replay()`` runs them again (as CUDA graphs do).

Capture goes through the one dispatch pipeline: every top-level op runs its own handler
(values exactly as eager), but the kernels it runs are collected into the graph instead of
being put on the stream. Each op is a ``Node`` (its aten op, its arguments, the source line
of the user code that called it); each kernel a ``Kernel`` that depends on the kernels that
last wrote the buffers it reads (read after write) and, for a buffer it writes, on those that
read or wrote it before (write after read/write). Views alias their base's buffer; an op
without a kernel passes its inputs' producers on to its outputs.

When the block ends (and at every ``replay``) the graph is timed as a whole through the
pass pipeline (``passes``): fusion, overlap and shared copies rewrite the kernel list, and
``join`` joins the kernels' programs and runs them in ONE simulation, and the graph goes on the stream as one record
(one launch) whose parts are its kernels, with their spans, on their own trace tracks. The
timing of a graph is cached by what it ran (the same kernel runs, the same dependencies, the
same machine): a graph captured or replayed again with the same shapes is not simulated
again; one that differs from the last simulated only in some kernels' shapes (decode with a
growing KV cache) is re-timed from it (``Graph._retime``, docs/model.md).

Replay re-runs every node through ``dispatch`` (the same handlers) on the tensors it was
captured with, the outputs of earlier nodes standing for the values they had: inputs are
read as they are now (copy new data into them, as into CUDA graphs' static inputs), and
tensors the program still holds after capture are updated in place (``_value``). Python
control flow and host values read during capture (``.item()``) are fixed, as in CUDA graphs.
"""
from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field, replace

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ...ops.contract import bottleneck, memory_bytes
from ...kernel import current_fidelity
from ...kernel.door import paused_gc
from ...topology import current_machine
from ...topology.select import as_machine
from ...topology.kinds import kind_name
from .. import stream
from ..dispatch import dispatch, is_ahbm, root, uid
from ..stream import CAPTURE
from ..tensor import AhbmTensor
from ..timing import Timed
from . import fusion, join, passes
from ... import state

#: Simulated graphs kept (key -> Scheduled plan); the oldest is dropped beyond this.
CACHE_MAX = 64
_CACHE: dict = state.cache({}, "kbtorch.tensor.graph.capture._CACHE")
#: The last graph simulated of each shape key (``fusion.shape_key``): (its kernel runs, plan,
#: schedule), what like graphs are re-timed from.
_LIKE: dict = state.cache({}, "kbtorch.tensor.graph.capture._LIKE")
#: Each timed graph's kernels as parts and its counters (``_timed_parts``): what a replayed
#: step records again.
_PARTS: dict = state.cache({}, "kbtorch.tensor.graph.capture._PARTS")
#: A graph like a simulated one (the same ops, dependencies and kernel kinds) is re-timed from
#: it while its kernels, each simulated alone, moved at most this fraction of the simulated
#: graph's latency in all (the sum of the changes' sizes); beyond, it is simulated (docs/model.md).
RETIME_TOLERANCE = 0.01


@dataclass
class Node:
    """One op of the graph: the aten op, its arguments (``Slot`` for values made by earlier
    nodes), the slots of its outputs, the source line that called it, its kernels."""

    index: int
    func: object
    args: tuple
    kwargs: dict
    outs: list
    site: str
    kernels: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"aten::{self.func.overloadpacket.__name__}"


@dataclass(frozen=True)
class Slot:
    """A value made inside the graph (by the node that made it), by number."""

    index: int


@dataclass
class Kernel:
    """One kernel of the graph: the stream record it would have been (``Timed``), its node,
    and the kernels it depends on."""

    timed: Timed
    node: int
    deps: frozenset
    reads: frozenset = frozenset()      # buffers (ids of roots) its node reads, for its node's first kernel
    writes: frozenset = frozenset()     # buffers its node writes, for its node's last kernel

    @property
    def programs(self) -> dict:
        return self.timed.result.programs or {}


class _Replaying:
    """Stands in for the graph while it replays: kernels are dropped (timed as a graph)."""

    depth = 1

    def kernel(self, machine, run):
        return None


def user_site() -> str:
    """``file:line`` of the innermost frame outside kbtorch and torch (the user's op).

    NOTE: walks the frames themselves: ``traceback.extract_stack`` reads every frame's source
    line, a third of a captured op's host time (each op of each replayed decode step)."""
    frame = sys._getframe(1)
    while frame is not None:
        f = frame.f_code.co_filename.replace("\\", "/")
        if "/kbtorch/" not in f and "/torch/" not in f and "/contextlib" not in f:
            return f"{f.rsplit('/', 1)[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class Graph:
    """A captured graph (see the module docstring): ``nodes``, ``kernels``, and once timed,
    ``plan`` (the fused kernels and their schedule), ``latency_ns`` and ``report()``.
    ``machine``: a Machine, a topology name or a path (the ops must run on it: ``kbtorch.use``).
    ``replay()`` re-runs the captured nodes whatever changed since (CUDA-graph semantics);
    ``kbtorch.graphed`` captures again when what a call read changed (docs/model.md)."""

    def __init__(self, machine=None, *, fuse: bool = True, mode: str = "auto", name: str = "graph",
                 periodic: bool = True, order: str = "program", overlap: bool = True):
        if order not in ("program", "ready"):
            raise ValueError(f"kbtorch.graph(order={order!r}): 'program' or 'ready'")
        # NOTE: a machine name or path as everywhere else (``as_machine``); the ops still run on
        # the machine in force, so one of another machine is refused at its first kernel.
        self.machine = None if machine is None else as_machine(machine)
        self._asked = self.machine is not None
        self.fuse, self.mode, self.name = fuse, mode, name
        self.periodic, self.order, self.overlap = periodic, order, overlap
        self.nodes: list[Node] = []
        self.kernels: list[Kernel] = []
        self.depth = 0
        self.plan = None
        self.cached = False           # timed from the cache: the same kernel runs simulated before
        self.retimed = False          # re-timed from a like graph simulated before (``_retime``)
        self._writer: dict = {}       # uid(root) -> kernels that last wrote it
        self._readers: dict = {}      # uid(root) -> kernels that read it since
        self._slots: dict = {}        # uid(tensor) -> Slot
        self._live: dict = {}         # slot index -> weakref of its tensor (outputs the program keeps)
        self.readers: dict = {}       # uid(root) -> kernels reading it (-1: an op without a kernel)
        self._roots: dict = {}        # uid(root) -> weakref of every buffer written
        self.live_roots: set = set()  # buffers the program holds after capture (always written)
        self.replicas: dict = {}      # uid(root) -> the kernel that made its replicated copy (a gather)
        self._last_use: dict = {}     # slot index -> the last node reading it (while capturing)
        self._frees: dict = {}        # node index -> the slots it reads last (dropped after it in replay)
        self._token = None

    # -- capture -----------------------------------------------------------------------------
    def __enter__(self) -> "Graph":
        if CAPTURE.get() is not None:
            raise RuntimeError("kbtorch.graph(): a graph is already being captured in this context")
        self._token = CAPTURE.set(self)
        return self

    def __exit__(self, *exc) -> None:
        CAPTURE.reset(self._token)
        self._token = None
        if exc[0] is not None:
            return
        self._finish_capture()
        self.run()

    def op(self, cls, func, args, kwargs):
        """Dispatch one top-level op and record it as a node (called by ``dispatch``)."""
        first = len(self.kernels)
        self.depth += 1
        try:
            out = dispatch(cls, func, args, kwargs)
        finally:
            self.depth -= 1
        node = Node(len(self.nodes), func, self._slotted(args), self._slotted(kwargs), [], user_site())
        self.nodes.append(node)
        self._link(node, first, args, kwargs, out)
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor):
                slot = Slot(len(self._live))
                self._slots[uid(leaf)] = slot
                self._live[slot.index] = weakref.ref(leaf)
                node.outs.append(slot)
            else:
                node.outs.append(None)
        return out

    def kernel(self, machine, run: Timed) -> None:
        """A kernel an op ran (called by ``kernels.record``): joins the current node; one run
        outside any op (a direct ``redistribute``) depends on every kernel before it."""
        if self.machine is None:
            self.machine = machine
        elif machine is not self.machine and self._asked:
            raise RuntimeError(f"kbtorch.graph(machine='{self.machine.name}'): the ops ran on '{machine.name}', "
                               f"the machine in force: run them under kbtorch.use('{self.machine.name}')")
        elif machine is not self.machine:
            raise RuntimeError(f"kbtorch.graph(): kernels of two machines ('{self.machine.name}' and "
                               f"'{machine.name}') in one graph")
        deps = frozenset() if self.depth else frozenset(range(len(self.kernels)))
        self.kernels.append(Kernel(run, len(self.nodes), deps))

    def _slotted(self, x):
        return tree_map(lambda v: self._slots.get(getattr(v, "_uid", None), v) if isinstance(v, torch.Tensor) else v, x)

    def _link(self, node: Node, first: int, args, kwargs, out) -> None:
        """Dependencies of the node's kernels (``first`` on), and who now wrote what."""
        reads = {uid(root(a)) for a in tree_flatten((args, kwargs))[0] if is_ahbm(a)}
        made = [root(o) for o in tree_flatten(out)[0] if is_ahbm(o)]
        writes = {uid(r) for r in made}
        if node.func.overloadpacket.__name__.endswith("_") and args and is_ahbm(args[0]):
            writes.add(uid(root(args[0])))
        for slot in tree_flatten((node.args, node.kwargs))[0]:
            if isinstance(slot, Slot):
                self._last_use[slot.index] = node.index
        # NOTE: a buffer read replicated after another op gathered it waits for that gather.
        gathered = {self.replicas[r] for r in reads if self.replicas.get(r, first) < first}
        before = frozenset().union(*(self._writer.get(r, ()) for r in reads), gathered)
        hazards = frozenset().union(*(self._writer.get(w, ()) for w in writes),
                                    *(self._readers.get(w, ()) for w in writes))
        mine = list(range(first, len(self.kernels)))
        node.kernels = mine
        for r in reads:
            self.readers.setdefault(r, set()).add(mine[0] if mine else -1)
        for o in made + ([root(args[0])] if node.name.endswith("_") and args and is_ahbm(args[0]) else []):
            self._roots.setdefault(uid(o), weakref.ref(o))
        if mine:
            self.kernels[mine[0]].reads = frozenset(reads)
            self.kernels[mine[-1]].writes = frozenset(writes)
        if not mine:
            for w in writes - reads:
                self._writer[w] = before
            return
        deps = before | hazards
        for k in mine:
            self.kernels[k].deps = self.kernels[k].deps | deps
            deps = frozenset((k,))
        for r in reads - writes:
            self._readers[r] = self._readers.get(r, frozenset()) | {mine[-1]}
        for w in writes:
            self._writer[w], self._readers[w] = frozenset((mine[-1],)), frozenset()
            self.replicas.pop(w, None)

    def _finish_capture(self) -> None:
        """Forget the capture's tables: what stays alive is the program's."""
        self._slots.clear()
        for slot, node in self._last_use.items():
            self._frees.setdefault(node, []).append(slot)
        self._last_use.clear()
        self.live_roots = {r for r, ref in self._roots.items() if ref() is not None}
        self._writer.clear()
        self._readers.clear()
        self.replicas.clear()

    def live(self, slot: Slot) -> bool:
        """Whether the program still holds the value of ``slot`` (a graph output)."""
        ref = self._live.get(slot.index)
        return ref is not None and ref() is not None

    # -- timing ------------------------------------------------------------------------------
    def run(self) -> None:
        """Time the graph (cached, or re-timed from a like graph) and put it on the stream as
        one launch."""
        if not self.kernels:
            return
        machine = self.machine or current_machine()
        # NOTE: the keys are known before fusion builds anything: a cached graph costs a lookup.
        # They hold the fidelity in force, and the machine itself, not its id: a machine that
        # died (a sweep's point) could leave its id to another machine, which would then be
        # served the first one's timing.
        how = (machine, current_fidelity(), self.mode, self.periodic, self.order, self.overlap)
        key, like = how + (fusion.key(self),), how + (fusion.shape_key(self),)
        got = _CACHE.get(key)
        self.cached, self.retimed = got is not None, False
        if got is None:
            got = self._retime(_LIKE.get(like))
            self.retimed = got is not None
        if got is None:
            with paused_gc():
                got = self._simulate(machine)
            _LIKE[like] = (tuple(k.timed.result for k in self.kernels), *got)
        _CACHE[key] = got
        for cache in (_CACHE, _LIKE):
            if len(cache) > CACHE_MAX:
                del cache[next(iter(cache))]
        self.plan, self.schedule = got
        _record(self, machine, *got)

    def _simulate(self, machine) -> tuple:
        """(plan, schedule): the graph through the pass pipeline (``passes``), simulated in one run."""
        plan = passes.plan(self)
        return plan, passes.schedule(self, plan, machine)

    def _retime(self, anchor) -> tuple | None:
        """(plan, schedule) of ``anchor`` (a simulated graph of the same ops, dependencies and
        kernel kinds: ``fusion.shape_key``) re-timed for this graph's kernel runs, or None when
        its kernels alone moved more than ``RETIME_TOLERANCE`` of its latency (re-simulate).

        NOTE: decode with ``DynamicCache``: each step's graph differs from the last only in
        the KV length (the attention and cache-concat kernels, each simulated alone for its new
        shape); the schedule is re-run on the simulated spans (``join.retime``)."""
        if anchor is None:
            return None
        runs, plan, sched = anchor
        if len({m for k in plan.kernels for m in k.members}) < sum(len(k.members) for k in plan.kernels):
            return None         # NOTE: chunks of one kernel (``overlap``) share its members: simulate again
        moved = [k.timed.result.latency_ps - r.latency_ps for k, r in zip(self.kernels, runs)]
        if sum(map(abs, moved)) > RETIME_TOLERANCE * sched.latency_ps:
            return None
        delta = [sum(moved[m] for m in k.members) for k in plan.kernels]
        plan = replace(plan, keep=tuple(k.timed.result for k in self.kernels))   # NOTE: the cache key's ids stay theirs
        return plan, join.retime(sched, [k.deps for k in plan.kernels], delta)

    @property
    def latency_ns(self) -> float:
        return self.schedule.latency_ps / 1000 if self.plan else 0.0

    def report(self) -> str:
        """The fusion report: which ops became which kernel (``fusion.report``)."""
        return fusion.report(self) if self.plan else "(graph not timed yet)"

    # -- replay ------------------------------------------------------------------------------
    def replay(self) -> None:
        """Run every node again through ``dispatch`` (see the module docstring), then time the
        graph (cached: not simulated again) as one launch on the stream."""
        values: dict = {}
        token = CAPTURE.set(_Replaying())
        try:
            for node in self.nodes:
                def fill(v):
                    return values[v.index] if isinstance(v, Slot) else v
                out = dispatch(AhbmTensor, node.func, tree_map(fill, node.args), tree_map(fill, node.kwargs))
                for slot, leaf in zip(node.outs, tree_flatten(out)[0]):
                    if slot is not None:
                        values[slot.index] = leaf
                        self._update(slot, leaf)
                # NOTE: a value no later node reads is dropped (its HBM freed), as a memory planner frees at last use.
                for slot in self._frees.get(node.index, ()):
                    values.pop(slot, None)
        finally:
            CAPTURE.reset(token)
        self.run()

    def _update(self, slot: Slot, value) -> None:
        ref = self._live.get(slot.index)
        kept = ref() if ref is not None else None
        if kept is None or kept is value:
            return
        if is_ahbm(kept):
            kept._value = value._value if is_ahbm(value) else value
        elif isinstance(kept, torch.Tensor):
            kept.copy_(value)


def _record(graph: Graph, machine, plan, sched) -> None:
    """The graph on the stream: one record of its whole span; its kernels as parts."""
    parts, flops, nbytes, neck = _timed_parts(machine, plan, sched)
    r = sched.result
    per = getattr(r, "extrapolated", None)
    how = f", {per[0].count} repeats of {per[0].length} kernels: 3 simulated, the rest at their period " \
          f"{per[1] / 1000:.1f} ns" if per else ""
    stream.record(graph.name, (), f"graph of {len(plan.kernels)} kernels", r.latency_ns, flops=flops, bytes=nbytes,
                  bottleneck=neck, detail=f"{len(graph.nodes)} ops, {len(graph.kernels)} kernels before fusion, "
                  f"{sched.commands} commands, one launch{how}", parts=parts, obtained=r.obtained)


def _timed_parts(machine, plan, sched) -> tuple:
    """(the kernels as parts, flops, bytes served, bottleneck) of a graph timed as
    ``plan``/``sched``.

    NOTE: kept per schedule (``_PARTS``, which holds the plan and schedule so that their
    ids stay theirs): a replayed decode step records the same graph again without sorting
    its kernels' PEs or reading its counters again (a sixth of a replayed Qwen2.5-7B step)."""
    key = (id(plan), id(sched), machine)
    got = _PARTS.get(key)
    if got is not None:
        return got[2]
    parts = []
    for kern, ready, finish in zip(plan.kernels, sched.ready_ps, sched.finish_ps):
        pes = sorted(pe for pe, cmds in kern.programs.items() if cmds)
        detail = f"PEs {pes[0]}-{pes[-1]} ({len(pes)})" if pes else "no PEs"
        parts.append(stream.OpRecord(kern.name, kern.shapes, kern.kernel, ready / 1000, (finish - ready) / 1000,
                                       flops=kern.flops, detail=f"{detail}; {kern.detail}".rstrip("; ")))
    r = sched.result
    out = (tuple(parts), sum(k.flops for k in plan.kernels), memory_bytes(machine, r, None), kind_name(bottleneck(r)))
    _PARTS[key] = (plan, sched, out)
    if len(_PARTS) > CACHE_MAX:
        del _PARTS[next(iter(_PARTS))]
    return out
