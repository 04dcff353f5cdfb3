"""The host-facing runtime: deploys tensors and launches kernels, knows nothing about routing.

A :class:`Buffer` is a byte range of one memory node, named by the PE that owns it and a
level (``hbm``: the PE's HBM slice, ``sram``: its CUBE's shared SRAM, ``tcm``: its TCM).
Deployed data is a host-side copy (untimed setup); launched programs run together, from
t = 0, on a fresh :class:`~kbtorch.sim.simulator.Simulator` at :meth:`Runtime.run`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..sim.commands import Command, Loc
from ..sim.simulator import RunResult, Simulator
from ..topology.machine import Machine, load_machine
from ..units import check_pe
from .allocator import Allocator, capacity_bytes

LEVELS = ("hbm", "sram", "tcm")


@dataclass(frozen=True)
class Buffer:
    """``nbytes`` bytes at byte address ``addr`` of memory node ``node``."""

    pe: int
    level: str
    node: str
    addr: int
    nbytes: int

    def loc(self, offset: int = 0) -> Loc:
        """The address ``offset`` bytes into the buffer, for a command."""
        if not 0 <= offset < self.nbytes:
            raise ValueError(f"offset {offset} is outside the buffer of {self.nbytes} bytes at '{self.node}'")
        return Loc(self.node, self.addr + offset)


class Runtime:
    """Buffers, host-side data and launched programs for one machine."""

    def __init__(self, machine_or_name: Machine | str = "ahbm", mode: str = "fast", trace: bool = False):
        self.machine = load_machine(machine_or_name) if isinstance(machine_or_name, str) else machine_or_name
        self.mode, self.trace = mode, trace
        self.allocators: dict[str, Allocator] = {}
        self.last_sim: Simulator | None = None
        self._data: dict[Buffer, np.ndarray | None] = {}
        self._programs: dict[int, list] = {}

    def memory_node(self, pe: int, level: str) -> str:
        """The memory node of PE ``pe`` at ``level``."""
        if level not in LEVELS:
            raise ValueError(f"unknown memory level '{level}' (expected one of {', '.join(LEVELS)})")
        info = self.machine.pes[check_pe(pe, len(self.machine.pes))]
        node = info.node("tcm") if level == "tcm" else getattr(info, level)
        if node is None:
            raise ValueError(f"PE {pe} has no {level} in topology '{self.machine.name}'")
        return node

    def allocator(self, node: str) -> Allocator:
        a = self.allocators.get(node)
        if a is None:
            a = self.allocators[node] = Allocator(node, capacity_bytes(node, self.machine.node(node)))
        return a

    def alloc(self, pe: int, nbytes: int, level: str = "hbm") -> Buffer:
        """A new buffer of ``nbytes`` bytes in PE ``pe``'s memory at ``level``."""
        node = self.memory_node(pe, level)
        buf = Buffer(pe, level, node, self.allocator(node).alloc(nbytes), nbytes)
        self._data[buf] = None
        return buf

    def free(self, buf: Buffer) -> None:
        if buf not in self._data:
            raise ValueError(f"{buf} is not allocated (freed twice, or from another runtime?)")
        self.allocator(buf.node).free(buf.addr)
        del self._data[buf]

    def deploy(self, buf: Buffer, data) -> None:
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

    def read(self, buf: Buffer) -> np.ndarray:
        """A copy of the buffer's bytes (uint8); zeros where nothing was deployed."""
        if buf not in self._data:
            raise ValueError(f"cannot read {buf}: it is not allocated")
        store = self._data[buf]
        return np.zeros(buf.nbytes, dtype=np.uint8) if store is None else store.copy()

    def launch(self, pe: int, commands) -> None:
        """Append ``commands`` to PE ``pe``'s program for the next :meth:`run`."""
        check_pe(pe, len(self.machine.pes))
        commands = list(commands)
        for cmd in commands:
            if not isinstance(cmd, Command):
                raise TypeError(f"PE {pe}: {cmd!r} is not a command")
        self._programs.setdefault(pe, []).extend(commands)

    def run(self) -> RunResult:
        """Run every launched program from t = 0 on a fresh simulator; the programs are consumed."""
        programs, self._programs = self._programs, {}
        self.last_sim = Simulator(self.machine, mode=self.mode, trace=self.trace)
        return self.last_sim.run(programs)
