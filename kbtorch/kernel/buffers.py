"""Buffers of the tile-kernel API: every buffer names its memory level (HBM, SRAM, TCM).

A PE's TCM holds ``capacity_mib`` (16 MiB on AHBM), of which ``scratch_mib`` (1 MiB) is
kernel scratch reserved for the system; kernels allocate from the rest, and a buffer that
does not fit is an error naming the kernel, the PE and the buffer.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..sim.commands import Loc

HBM, SRAM, TCM = "hbm", "sram", "tcm"
LEVELS = (HBM, SRAM, TCM)
ALIGN = 256


class TcmOverflow(ValueError):
    """A kernel asked for more TCM than a PE has."""


@dataclass(frozen=True)
class Buf:
    """``nbytes`` at byte ``addr`` of memory node ``node`` (level ``level``) of PE ``pe``."""

    name: str
    level: str
    pe: int
    node: str
    addr: int
    nbytes: int

    def at(self, offset: int = 0) -> Loc:
        """The address ``offset`` bytes into the buffer."""
        if not 0 <= offset < self.nbytes:
            raise ValueError(f"buffer '{self.name}' ({self.level}, {self.nbytes} bytes): offset {offset} is outside it")
        return Loc(self.node, self.addr + offset)


class TcmArena:
    """Bump allocation of one PE's TCM for one kernel launch."""

    def __init__(self, kernel: str, pe: int, node: str, params: dict):
        self.kernel, self.pe, self.node = kernel, pe, node
        self.total = int(params.get("capacity_mib", 16) * 2**20)
        self.scratch = int(params.get("scratch_mib", 1) * 2**20)
        self.used = 0
        self.buffers: list[Buf] = []

    @property
    def capacity(self) -> int:
        """Bytes a kernel may allocate (TCM minus kernel scratch)."""
        return self.total - self.scratch

    def alloc(self, name: str, nbytes: int) -> Buf:
        if nbytes <= 0:
            raise ValueError(f"kernel '{self.kernel}' PE {self.pe}: TCM buffer '{name}' of {nbytes} bytes")
        size = -(-nbytes // ALIGN) * ALIGN
        if self.used + size > self.capacity:
            raise TcmOverflow(
                f"kernel '{self.kernel}' PE {self.pe}: TCM buffer '{name}' of {nbytes / 2**20:.2f} MiB does not fit: "
                f"{self.used / 2**20:.2f} of {self.capacity / 2**20:.2f} MiB already in use "
                f"({self.total / 2**20:g} MiB TCM, {self.scratch / 2**20:g} MiB kernel scratch)")
        buf = Buf(name, TCM, self.pe, self.node, self.used, nbytes)
        self.used += size
        self.buffers.append(buf)
        return buf
