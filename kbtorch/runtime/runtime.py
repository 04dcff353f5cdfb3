"""The host-facing runtime: deploys tensors and launches kernels, knows nothing about routing.

Buffers are :class:`~kbtorch.runtime.allocator.Buf` (a byte range of one memory node, named
by the PE that owns it and a level: ``hbm`` the PE's HBM, ``sram`` the shared SRAM, ``tcm``
its TCM), allocated from the one memory model (``memory.Memories``).
Deployed data is a host-side copy (untimed setup); launched programs run together, from
t = 0, on a fresh :class:`~kbtorch.sim.simulator.Simulator` at :meth:`Runtime.run`.
"""
from __future__ import annotations

import numpy as np

from ..sim.commands import Command, Dma
from ..sim.simulator import RunResult, Simulator
from ..topology import Machine, as_machine
from ..units import check_pe
from .allocator import Allocator, Buf, Memories

class Runtime:
    """Bufs, host-side data and launched programs for one machine."""

    def __init__(self, machine: Machine | str | None = None, mode: str = "fast", trace: bool = False):
        self.machine = as_machine(machine)
        self.mode, self.trace = mode, trace
        self.memories = Memories(self.machine)
        self.last_sim: Simulator | None = None
        self._data: dict[Buf, np.ndarray | None] = {}
        self._programs: dict[int, list] = {}

    def memory_node(self, pe: int, level: str) -> str:
        """The memory node of PE ``pe`` at ``level``."""
        return self.memories.node(check_pe(pe, len(self.machine.pes)), level)

    def allocator(self, node: str) -> Allocator:
        return self.memories.allocator(node)

    def alloc(self, pe: int, nbytes: int, level: str = "hbm", name: str = "") -> Buf:
        """A new buffer of ``nbytes`` bytes in PE ``pe``'s memory at ``level``."""
        buf = self.memories.alloc(check_pe(pe, len(self.machine.pes)), level, nbytes, name)
        self._data[buf] = None
        return buf

    def free(self, buf: Buf) -> None:
        if buf not in self._data:
            raise ValueError(f"{buf} is not allocated (freed twice, or from another runtime?)")
        self.memories.free(buf)
        del self._data[buf]

    def deploy(self, buf: Buf, data) -> None:
        """Store a host-side copy of ``data`` (bytes or an array, taken as raw bytes) in ``buf``."""
        raw = self._bytes(data)
        if buf not in self._data:
            raise ValueError(f"cannot deploy to {buf}: it is not allocated")
        if raw.size > buf.nbytes:
            raise ValueError(f"cannot deploy {raw.size} bytes into a buffer of {buf.nbytes} bytes at '{buf.node}'")
        store = np.zeros(buf.nbytes, dtype=np.uint8)
        store[:raw.size] = raw
        self._data[buf] = store

    @staticmethod
    def _bytes(data) -> np.ndarray:
        if isinstance(data, (bytes, bytearray, memoryview)):
            return np.frombuffer(bytes(data), dtype=np.uint8)
        return np.ascontiguousarray(np.asarray(data)).reshape(-1).view(np.uint8)

    def read(self, buf: Buf) -> np.ndarray:
        """A copy of the buffer's bytes (uint8); zeros where nothing was deployed."""
        if buf not in self._data:
            raise ValueError(f"cannot read {buf}: it is not allocated")
        store = self._data[buf]
        return np.zeros(buf.nbytes, dtype=np.uint8) if store is None else store.copy()

    def launch(self, pe: int, commands) -> None:
        """Append ``commands`` to PE ``pe``'s program for the next :meth:`run`; a DMA must stay
        inside buffers allocated here (nothing is appended if one does not)."""
        check_pe(pe, len(self.machine.pes))
        commands = list(commands)
        for cmd in commands:
            if not isinstance(cmd, Command):
                raise TypeError(f"PE {pe}: {cmd!r} is not a command")
            if isinstance(cmd, Dma):
                for end, loc, stride in (("source", cmd.src, cmd.src_stride), ("destination", cmd.dst, cmd.dst_stride)):
                    self._check_range(pe, cmd, end, loc, stride)
        self._programs.setdefault(pe, []).extend(commands)

    def _check_range(self, pe: int, cmd, end: str, loc, stride: int) -> None:
        known = loc.node in self.memories.allocators
        extent = self.machine.span(loc.node, cmd.nbytes, stride) if known else cmd.nbytes
        ok = known and isinstance(loc.addr, int) and loc.addr >= 0 and cmd.nbytes > 0 \
            and self.memories.allocators[loc.node].holds(loc.addr, extent)
        if not ok:
            raise ValueError(f"PE {pe} {cmd.describe()}: the {end} range of {extent} bytes at '{loc.node}' address "
                             f"{loc.addr} is not inside a buffer allocated with Runtime.alloc")

    def run(self) -> RunResult:
        """Run every launched program from t = 0 on a fresh simulator; the programs are consumed."""
        programs, self._programs = self._programs, {}
        self.last_sim = Simulator(self.machine, mode=self.mode, trace=self.trace)
        return self.last_sim.run(programs)
