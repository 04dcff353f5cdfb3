"""The tile-kernel API: a kernel is a Python function run SPMD on a group of PEs.

``launch(kernel, pes, machine, *args)`` calls ``kernel(ctx, *args)`` once per PE of the
group, in PE order; ``ctx`` knows its PE, its rank in the group and the group, allocates TCM
named buffers at any memory level (``ctx.hbm``, ``ctx.sram``, ``ctx.tcm``, from the one
memory model ``runtime.memory``: PEs that share a memory node get disjoint ranges), and queues commands for that PE's engines (the Dataflow ISA of Maia 200, Fig. 2):

- ``dma_read`` (HBM/SRAM/remote -> TCM) and ``dma_write`` (TCM -> HBM/SRAM/remote),
- ``fetch`` (TCM -> GEMM/MATH engine), ``gemm``, ``math``, ``store`` (engine -> TCM),
- ``multicast`` (one payload to several memories; the routers replicate it where the routes
  part, on a machine that declares multicast there),
- ``send`` (an IPCQ message that raises a semaphore of another PE),
- ``composite`` (a tiled DMA_READ -> FETCH -> GEMM/MATH -> STORE -> DMA_WRITE pipeline).

Every command takes ``wait=`` and ``signal=``: up to two semaphores each, given as names
(threshold 1, decrement 1 / increment 1) or as ``Wait``/``Signal``; DMA and composite
commands also take ``notify=[(pe, sem), ...]``, semaphores of other PEs raised when their
data has landed. The programs then run on
a fresh simulator; the result is the simulator's ``RunResult``.
"""
from __future__ import annotations

import weakref

from ..runtime.allocator import AllocationError, Buf, Memories
from ..sim import symmetry
from ..sim.commands import Composite, Compute, Dma, Fetch, Loc, Multicast, Send, Signal, Store, Wait
from ..sim.components.dma import data_path
from ..sim.multicast import MulticastError, can_multicast, check, tree
from ..sim.simulator import RunResult
from .door import simulator
from . import steady

def _waits(items) -> tuple:
    return tuple(Wait(x) if isinstance(x, str) else x for x in ((items,) if isinstance(items, (str, Wait)) else items))


def _signals(items) -> tuple:
    return tuple(Signal(x) if isinstance(x, str) else x for x in ((items,) if isinstance(items, (str, Signal)) else items))


def _count(x, what: str, minimum: int = 1) -> int:
    """``x`` as an int of at least ``minimum``; a TypeError/ValueError naming ``what`` otherwise."""
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"{what} must be an int, got {type(x).__name__} {x!r}")
    if x < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {x}")
    return x


class PEContext:
    """What a kernel sees on one PE; collects that PE's commands and buffers."""

    def __init__(self, machine, kernel: str, pe: int, group: tuple, memories: Memories, built: dict):
        self.machine, self.kernel, self.pe, self.group = machine, kernel, pe, group
        self.rank = group.index(pe)
        self.info = machine.pes[pe]
        self.memories, self._built = memories, built
        self.buffers: dict[str, Buf] = {}
        self.commands: list = []

    @property
    def hbm_node(self) -> str:
        return self.info.hbm

    def hbm(self, name: str, nbytes: int) -> Buf:
        """A buffer in this PE's HBM (its slice, or its share of a die-wide HBM)."""
        return self._alloc("hbm", name, nbytes)

    def sram(self, name: str, nbytes: int) -> Buf:
        """A buffer in the SRAM this PE shares."""
        return self._alloc("sram", name, nbytes)

    def tcm(self, name: str, nbytes: int) -> Buf:
        """A buffer in this PE's TCM (less the kernel scratch the topology reserves)."""
        return self._alloc("tcm", name, nbytes)

    def largest_free(self, level: str) -> int:
        """The largest buffer that ``level`` ("hbm", "sram", "tcm") of this PE still takes."""
        return self.memories.allocator(self.memories.node(self.pe, level)).largest_free

    def buffer(self, name: str) -> Buf:
        """This PE's buffer ``name``; a KeyError names the buffers it has."""
        if name not in self.buffers:
            raise KeyError(f"kernel '{self.kernel}' PE {self.pe}: no buffer '{name}' (has: {', '.join(self.buffers)})")
        return self.buffers[name]

    def remote(self, pe: int, name: str) -> Buf:
        """Buffer ``name`` of PE ``pe`` of the group (allocated by a kernel that ran before:
        kernels run in group order)."""
        if pe not in self._built:
            raise KeyError(f"kernel '{self.kernel}' PE {self.pe}: PE {pe} is not in the group {list(self.group)}")
        return self._built[pe].buffer(name)

    def _alloc(self, level: str, name: str, nbytes: int) -> Buf:
        if name in self.buffers:
            raise ValueError(f"kernel '{self.kernel}' PE {self.pe}: buffer '{name}' is allocated twice")
        where = f"kernel '{self.kernel}' PE {self.pe}: {level.upper()} buffer '{name}'"
        try:
            buf = self.memories.alloc(self.pe, level, nbytes, name)
        except AllocationError as exc:
            a = self.memories.allocator(self.memories.node(self.pe, level))
            raise AllocationError(f"{where} of {nbytes / 2**20:.2f} MiB does not fit: "
                                  f"{(a.capacity - a.free_bytes) / 2**20:.2f} of {a.capacity / 2**20:.2f} MiB "
                                  f"already in use ({exc})") from None
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: {exc}") from None
        self.buffers[name] = buf
        return buf

    def _add(self, cmd):
        self.commands.append(cmd)
        return cmd

    def _end(self, x, nbytes: int, stride: int, what: str) -> Loc:
        """A DMA end (a ``Loc``, a ``Buf`` or a memory node's name) whose whole range (with
        ``stride`` between bursts) lies inside its buffer, or inside its memory node."""
        if isinstance(x, str):
            x = Loc(x)
        if not isinstance(x, (Loc, Buf)):
            raise TypeError(f"{self._where(what)} must be a Loc, a buffer or a memory node name, got {x!r}")
        node = x.node
        if node not in self.machine.graph or self.machine.graph.nodes[node]["kind"] not in ("hbm", "sram", "tcm"):
            raise ValueError(f"{self._where(what)}: '{node}' is not a memory node")
        extent = self.machine.span(node, nbytes, stride)
        addr = _count(x.addr, f"{self._where(what)} address", 0)
        size = x.nbytes if isinstance(x, Buf) else self.machine.node_capacity(node)
        inside = f"buffer '{x.name}'" if isinstance(x, Buf) else f"'{node}'"
        if extent > size - (0 if isinstance(x, Buf) else addr):
            raise ValueError(f"{self._where(what)}: {extent} bytes from address {addr} run past the end of {inside} "
                             f"({size} bytes)")
        return x.loc() if isinstance(x, Buf) else x

    def _where(self, what: str) -> str:
        return f"kernel '{self.kernel}' PE {self.pe}: {what}"

    def _dma(self, engine: str, src, dst, nbytes: int, stride: int, **kw) -> Dma:
        _count(nbytes, self._where("DMA size"))
        _count(stride, self._where("DMA stride"), 0)
        src_stride, dst_stride = (stride, 0) if engine == "dma_rd" else (0, stride)
        return self._add(Dma(self._end(src, nbytes, src_stride, "DMA source"),
                             self._end(dst, nbytes, dst_stride, "DMA destination"), nbytes, engine=engine,
                             src_stride=src_stride, dst_stride=dst_stride, **kw))

    def dma_read(self, src, dst, nbytes: int, *, stride: int = 0, wait=(), signal=(), notify=(), label="dma_read"):
        """Read ``nbytes`` into this PE (``stride``: bytes between the source's bursts)."""
        return self._dma("dma_rd", src, dst, nbytes, stride, waits=_waits(wait), signals=_signals(signal),
                         notify=tuple(notify), label=label)

    def dma_write(self, src, dst, nbytes: int, *, stride: int = 0, wait=(), signal=(), notify=(), label="dma_write"):
        """Write ``nbytes`` out of this PE (``stride``: bytes between the destination's bursts)."""
        return self._dma("dma_wr", src, dst, nbytes, stride, waits=_waits(wait), signals=_signals(signal),
                         notify=tuple(notify), label=label)

    def multicast(self, src, dsts, nbytes: int, *, stride: int = 0, fallback: bool = False, wait=(), signal=(),
                  notify=(), label="multicast"):
        """Send ``nbytes`` from ``src`` to every destination of ``dsts`` (Locs, buffers or
        memory node names) as one payload down the multicast tree (``sim.multicast``); the
        command completes when all have it. On a machine without multicast where the routes
        part: a ``MulticastError`` naming the node, or with ``fallback=True`` one unicast copy
        per destination, labelled ``(unicast fallback)``."""
        _count(nbytes, self._where("multicast size"))
        _count(stride, self._where("multicast stride"), 0)
        if isinstance(dsts, (str, Loc, Buf)) or not dsts:
            raise ValueError(f"{self._where('multicast')}: dsts must be a non-empty list of destinations, got {dsts!r}")
        s = self._end(src, nbytes, stride, "multicast source")
        ends = tuple(self._end(d, nbytes, 0, f"multicast destination {i}") for i, d in enumerate(dsts))
        try:
            root = tree([data_path(self.machine, s.node, d.node) for d in ends])
            unicast = fallback and not can_multicast(self.machine, root)
            if not unicast:
                check(self.machine, root, self._where(label))
        except MulticastError as exc:
            raise MulticastError(f"{self._where(label)}: {exc}" if not str(exc).startswith("kernel") else str(exc)) from None
        own = s.node == self.info.node("tcm")
        return self._add(Multicast(s, ends, nbytes, engine="dma_wr" if own else "dma_rd", src_stride=stride,
                                   unicast=unicast, waits=_waits(wait), signals=_signals(signal),
                                   notify=tuple(notify), label=f"{label} (unicast fallback)" if unicast else label))

    def fetch(self, nbytes: int, *, engine: str = "gemm", wait=(), signal=(), label="fetch"):
        _count(nbytes, self._where("fetch size"))
        return self._add(Fetch(nbytes, engine=engine, waits=_waits(wait), signals=_signals(signal), label=label))

    def store(self, nbytes: int, *, engine: str = "gemm", wait=(), signal=(), label="store"):
        _count(nbytes, self._where("store size"))
        return self._add(Store(nbytes, engine=engine, waits=_waits(wait), signals=_signals(signal), label=label))

    def gemm(self, m: int, n: int, k: int, dtype: str = "f16", *, wait=(), signal=(), label="gemm"):
        """An m x k by k x n tile product (2*m*n*k flops) on the GEMM engine."""
        for name, x in (("m", m), ("n", n), ("k", k)):
            _count(x, self._where(f"gemm {name}"))
        return self._add(Compute(2 * m * n * k, engine="gemm", dtype=dtype, waits=_waits(wait),
                                 signals=_signals(signal), label=label))

    def math(self, op: str, elements: int, dtype: str = "f16", *, wait=(), signal=(), label=None):
        """A vector op over ``elements`` on the MATH engine, at the machine's cost per element."""
        flops = self.machine.math_flops(op, self.pe) * _count(elements, self._where(f"math {op} elements"))
        return self._add(Compute(flops, engine="math", dtype=dtype,
                                 waits=_waits(wait), signals=_signals(signal), label=label or f"math {op}"))

    def send(self, dst_pe: int, sem: str, *, nbytes: int = 0, wait=(), signal=(), label=None):
        return self._add(Send(dst_pe=dst_pe, sem=sem, nbytes=nbytes, waits=_waits(wait), signals=_signals(signal),
                              label=label or f"send to PE {dst_pe}"))

    def composite(self, *, wait=(), signal=(), notify=(), label="composite", **fields):
        """A ``Composite`` command (see kbtorch.sim.commands.Composite for the fields)."""
        return self._add(Composite(waits=_waits(wait), signals=_signals(signal), notify=tuple(notify),
                                   label=label, **fields))


def contexts(machine, pes, name: str) -> list[PEContext]:
    """One context per PE of the group ``pes`` (checked), sharing one set of memories: a
    kernel that emits its PEs' commands itself (a collective) uses these."""
    group = tuple(pes)
    if not group:
        raise ValueError("a kernel needs at least one PE")
    if len(set(group)) != len(group):
        raise ValueError(f"PE group {list(group)} names a PE twice")
    for pe in group:
        if not 0 <= pe < len(machine.pes):
            raise ValueError(f"PE {pe} is outside topology '{machine.name}' (PEs 0..{len(machine.pes) - 1})")
    # NOTE: each context finds its group's others through ``built``; held weakly, the
    # contexts form no reference cycle and are freed with the last list of them, not by
    # full runs of the cyclic collector (which scan every command graph mode keeps).
    memories, built = Memories(machine), weakref.WeakValueDictionary()
    out = []
    for pe in group:
        out.append(PEContext(machine, name, pe, group, memories, built))
        built[pe] = out[-1]
    return out


def build(kernel, pes, machine, *args, name: str | None = None) -> dict:
    """Run ``kernel(ctx, *args)`` for each PE of ``pes`` in order; -> ``{pe: [commands]}``."""
    ctxs = contexts(machine, pes, name or getattr(kernel, "__name__", "kernel"))
    for ctx in ctxs:
        kernel(ctx, *args)
    return {ctx.pe: ctx.commands for ctx in ctxs}


def launch(kernel, pes, machine, *args, mode: str = "fast", trace: bool = False, name: str | None = None,
           symmetric: bool | None = None) -> RunResult:
    """Build ``kernel``'s programs on ``pes`` and simulate them (``run_programs``); -> RunResult."""
    return run_programs(build(kernel, pes, machine, *args, name=name), machine, mode=mode, trace=trace,
                        symmetric=symmetric)


def run_programs(programs: dict, machine, *, mode="fast", trace: bool = False,
                 symmetric: bool | None = None, reduction=None) -> RunResult:
    """Simulate built programs ``{pe: [commands]}`` on a fresh simulator; -> RunResult.

    ``symmetric`` (default: on unless ``trace``) simulates one representative of each class
    of identical independent units (``sim.symmetry``): same latency and counters, fewer events.
    ``reduction``: that reduction when the caller knows it (``symmetry.images``), not looked for.
    ``mode``: a simulation mode, or a function of the programs simulated (the reduced ones)
    that gives it. The result keeps the built programs (``result.programs``): graph mode
    runs them again, beside other kernels', in one simulation (``kbtorch.tensor.graph.join``)."""
    if not (not trace if symmetric is None else symmetric):
        mode = mode(programs) if callable(mode) else mode
        with simulator(machine, mode=mode, trace=trace) as sim:
            result = sim.run(programs)
    else:
        red = reduction or symmetry.reduce(machine, programs)
        mode = mode(red.programs) if callable(mode) else mode
        with simulator(machine, mode=mode, trace=trace, weight=red.weight) as sim:
            result = red.expand(sim.run(red.programs), machine)
    result.programs = programs
    return steady.simulated(result, steady.check(None))
