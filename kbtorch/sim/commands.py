"""The commands a PE's engines execute (the Dataflow ISA of Maia 200's Fig. 2).

Every command may wait on up to two semaphores before it starts (value >= threshold, then
the value drops by ``dec``) and signal up to two when it ends. A DMA or composite command may
also ``notify`` other PEs: each ``(pe, sem)`` entry raises semaphore ``sem`` of PE ``pe`` by
one when the command's data has been committed (Maia 200's remote semaphore increment
together with data transmission). ``descriptor(issue)`` is the command's
hardware-logical descriptor size, from the topology's ``[issue] descriptor_bytes`` (or
``desc`` where a command gives its own), which sets its issue cost on the control processor
(``d_cmd = FIXED + descriptor * R``). Addresses are byte offsets inside a memory
node (an HBM slice, an SRAM, or a PE's TCM).
"""
from __future__ import annotations

from dataclasses import dataclass, field

@dataclass(frozen=True)
class Wait:
    """Precondition: start only when semaphore ``sem`` >= ``threshold``; then subtract ``dec``."""

    sem: str
    threshold: int = 1
    dec: int | None = None

    @property
    def take(self) -> int:
        return self.threshold if self.dec is None else self.dec


@dataclass(frozen=True)
class Signal:
    """Postcondition: add ``inc`` to semaphore ``sem`` of this PE when the command ends."""

    sem: str
    inc: int = 1


@dataclass(frozen=True)
class Loc:
    """A byte address inside one memory node."""

    node: str
    addr: int = 0


@dataclass(frozen=True)
class Command:
    waits: tuple = field(default=(), kw_only=True)
    signals: tuple = field(default=(), kw_only=True)
    label: str = field(default="", kw_only=True)
    desc: int = field(default=0, kw_only=True)
    notify: tuple = field(default=(), kw_only=True)
    mark: int = field(default=-1, kw_only=True)     # >= 0: the run keeps its mark's last completion

    engine = ""
    KIND = "compute"

    def __post_init__(self):
        for name, items, kind in (("waits", self.waits, Wait), ("signals", self.signals, Signal)):
            if len(items) > 2 or not all(isinstance(x, kind) for x in items):
                raise ValueError(f"{self.describe()}: {name} takes up to two {kind.__name__} entries, got {items!r}")
        if not all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], int) and isinstance(x[1], str)
                   for x in self.notify):
            raise ValueError(f"{self.describe()}: notify takes (pe, semaphore) pairs, got {self.notify!r}")

    def descriptor(self, issue) -> int:
        """Hardware-logical descriptor size (bytes): ``desc`` if given, else the machine's
        for this kind of command (``issue``: the machine's ``IssueCost``)."""
        return self.desc or issue.descriptor(self.KIND)

    def describe(self) -> str:
        return self.label or type(self).__name__.lower()


@dataclass(frozen=True)
class Dma(Command):
    """Move ``nbytes`` from ``src`` to ``dst`` on the PE's DMA read or write engine.

    ``src_stride``/``dst_stride`` are the distances in bytes between consecutive bursts at
    that end (0: contiguous).
    """

    src: Loc
    dst: Loc
    nbytes: int
    engine: str = "dma_rd"
    src_stride: int = 0
    dst_stride: int = 0

    KIND = "dma"


@dataclass(frozen=True)
class Multicast(Command):
    """Move ``nbytes`` from ``src`` to every ``Loc`` of ``dsts`` as one payload: the routers
    replicate it where the routes part (``sim.multicast``), so the source is read once and
    every link of the tree carries it once. The command completes (signals, notifies) when
    every destination has committed it. ``unicast=True`` is the named fallback for a machine
    without multicast at the split points: one copy per destination from the same engine,
    in parallel (the source read once per copy).
    """

    src: Loc
    dsts: tuple
    nbytes: int
    engine: str = "dma_rd"
    src_stride: int = 0
    unicast: bool = False

    KIND = "dma"

    def __post_init__(self):
        super().__post_init__()
        if not self.dsts or not all(isinstance(d, Loc) for d in self.dsts):
            raise ValueError(f"{self.describe()}: dsts takes one or more Loc entries, got {self.dsts!r}")


@dataclass(frozen=True)
class Compute(Command):
    """Occupy the GEMM or MATH engine for ``flops`` at its ``dtype`` rate."""

    flops: int
    engine: str = "gemm"
    dtype: str = "f16"


@dataclass(frozen=True)
class Send(Command):
    """IPCQ: send ``nbytes`` (at least one flit) to PE ``dst_pe``; on arrival its semaphore
    ``sem`` goes up by ``inc``."""

    dst_pe: int
    sem: str
    inc: int = 1
    nbytes: int = 0
    engine: str = "ipcq"
    KIND = "send"


@dataclass(frozen=True)
class Fetch(Command):
    """Move ``nbytes`` from the PE's TCM into the GEMM or MATH engine (its operand buffers)."""

    nbytes: int
    engine: str = "gemm"
    KIND = "fetch"


@dataclass(frozen=True)
class Store(Command):
    """Move ``nbytes`` of results from the GEMM or MATH engine into the PE's TCM."""

    nbytes: int
    engine: str = "gemm"
    KIND = "store"


@dataclass(frozen=True)
class Move:
    """One DMA of every tile of a composite: ``nbytes`` at ``loc.addr + i * step`` for tile i
    (``stride``: bytes between bursts at the memory end, 0 for contiguous)."""

    loc: Loc
    nbytes: int
    step: int = 0
    stride: int = 0
    share: "Share | None" = None


@dataclass(frozen=True)
class Share:
    """A composite read move shared by a gang of PEs through multicast.

    Every member's composite carries a read ``Move`` with the same ``key``; tile ``i`` of it
    is read ONCE, by member ``pes[i % len(pes)]`` from its own ``Move.loc``, and multicast
    into every member's staging buffer. It starts when every member's read stage has taken
    tile ``i`` (each member's buffer for it is free: credit flow control), and a member's
    read of tile ``i`` is done when its own copy has landed.
    """

    key: str
    pes: tuple

    def __post_init__(self):
        if len(self.pes) < 2 or len(set(self.pes)) != len(self.pes):
            raise ValueError(f"share '{self.key}': a gang of two or more distinct PEs, got {self.pes!r}")


@dataclass(frozen=True)
class Composite(Command):
    """One command carrying the pipeline DMA_READ -> FETCH -> GEMM/MATH -> STORE -> DMA_WRITE
    over ``tiles`` tiles, which the PE scheduler streams with ``buffers``-deep buffering.

    Per tile: every ``reads`` move lands in the TCM ``staging`` area, ``fetch_bytes`` go to
    the engine, ``flops`` run on it; every ``accumulate``-th tile (and the last) stores
    ``store_bytes`` back to TCM and runs the ``writes`` moves out of it. Its descriptor is the
    machine's ``composite`` bytes plus ``move`` bytes per move and ``stage`` bytes per
    non-empty engine stage.
    """

    tiles: int
    staging: Loc
    reads: tuple = ()
    fetch_bytes: int = 0
    flops: int = 0
    store_bytes: int = 0
    writes: tuple = ()
    accumulate: int = 1
    buffers: int = 2
    engine: str = "gemm"
    dtype: str = "f16"

    def __post_init__(self):
        super().__post_init__()
        if self.tiles < 1 or self.buffers < 1 or self.accumulate < 1:
            raise ValueError(f"{self.describe()}: tiles, buffers and accumulate must be at least 1")
        if not all(isinstance(m, Move) and m.nbytes > 0 for m in self.reads + self.writes):
            raise ValueError(f"{self.describe()}: reads and writes take Move entries of at least one byte")

    def descriptor(self, issue) -> int:
        stages = sum(1 for x in (self.fetch_bytes, self.flops, self.store_bytes) if x)
        return self.desc or issue.descriptor("composite", len(self.reads) + len(self.writes), stages)

    def stores_after(self, i: int) -> bool:
        """Whether tile ``i`` ends an accumulation (its result is stored and written)."""
        return (i + 1) % self.accumulate == 0 or i == self.tiles - 1
