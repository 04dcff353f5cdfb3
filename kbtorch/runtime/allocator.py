"""One memory model: named buffers at any level, allocated first-fit in their memory node.

A :class:`Buf` is ``nbytes`` at byte ``addr`` of a memory node (an HBM slice or a die-wide
HBM, an SRAM, a TCM), named, with the PE that asked for it and the level it was asked at.
:class:`Memories` holds one :class:`Allocator` per memory node of a machine, so PEs that
share a node (a die-wide HBM, a CUBE's SRAM) get disjoint ranges of it. The host runtime,
the tile kernels (``PEContext.hbm/sram/tcm``) and the device's HBM book all allocate here.

Blocks are aligned to the node's burst (HBM, SRAM) or the flit (TCM) and rounded up to a
multiple of it; free space is a sorted list of ``(addr, size)`` extents, merged with its
neighbours when a block is freed. A refused request leaves the allocator unchanged.
"""
from __future__ import annotations

from bisect import insort
from dataclasses import dataclass

from ..sim.commands import Loc
from ..topology.facts import LEVELS


class AllocationError(ValueError):
    """A request that does not fit; the allocator is left unchanged."""


def check_size(nbytes, what: str) -> int:
    """``nbytes`` as a positive int; a TypeError/ValueError naming ``what`` otherwise."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int):
        raise TypeError(f"{what}: a size must be an int, got {type(nbytes).__name__} {nbytes!r}")
    if nbytes <= 0:
        raise ValueError(f"{what}: size must be positive, got {nbytes}")
    return nbytes


@dataclass(frozen=True)
class Buf:
    """``nbytes`` at byte ``addr`` of memory node ``node`` (level ``level``), for PE ``pe``."""

    name: str
    level: str
    pe: int
    node: str
    addr: int
    nbytes: int

    def loc(self, offset: int = 0) -> Loc:
        """The address ``offset`` bytes into the buffer."""
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < self.nbytes:
            raise ValueError(f"buffer '{self.name}' ({self.level} of PE {self.pe}, {self.nbytes} bytes): "
                             f"offset {offset!r} is outside it")
        return Loc(self.node, self.addr + offset)


class Allocator:
    """Blocks of one memory node of ``capacity`` bytes, aligned to ``align`` bytes."""

    def __init__(self, node: str, capacity: int, align: int):
        self.node, self.capacity, self.align = node, capacity, align
        self._free: list[tuple[int, int]] = [(0, capacity)] if capacity > 0 else []
        self._used: dict[int, int] = {}
        self.used_bytes = 0         # bytes in blocks now (aligned sizes)
        self.peak_bytes = 0         # the most ``used_bytes`` has been (since ``reset_peak``)

    def reset_peak(self) -> None:
        """Start the peak again from the bytes used now."""
        self.peak_bytes = self.used_bytes

    @property
    def free_bytes(self) -> int:
        return sum(size for _, size in self._free)

    @property
    def largest_free(self) -> int:
        return max((size for _, size in self._free), default=0)

    def alloc(self, nbytes: int) -> int:
        """The address of a new block of at least ``nbytes`` bytes (first fit)."""
        check_size(nbytes, f"cannot allocate in '{self.node}'")
        size = -(-nbytes // self.align) * self.align
        for i, (addr, extent) in enumerate(self._free):
            if extent >= size:
                if extent == size:
                    del self._free[i]
                else:
                    self._free[i] = (addr + size, extent - size)
                self._used[addr] = size
                self.used_bytes += size
                self.peak_bytes = max(self.peak_bytes, self.used_bytes)
                return addr
        raise AllocationError(f"cannot allocate {nbytes} bytes in '{self.node}': {self.free_bytes} bytes free "
                              f"(largest free block {self.largest_free} bytes, capacity {self.capacity})")

    def clone(self) -> "Allocator":
        """An allocator with this one's blocks, that goes its own way from now on."""
        other = Allocator(self.node, self.capacity, self.align)
        other._free, other._used = list(self._free), dict(self._used)
        other.used_bytes, other.peak_bytes = self.used_bytes, self.peak_bytes
        return other

    def holds(self, addr: int, nbytes: int) -> bool:
        """Whether ``[addr, addr + nbytes)`` lies inside one allocated block."""
        for start, size in self._used.items():
            if start <= addr and addr + nbytes <= start + size:
                return True
        return False

    def free(self, addr: int) -> None:
        """Release the block at ``addr``."""
        size = self._used.pop(addr, None)
        if size is None:
            raise ValueError(f"no block allocated at address {addr} in '{self.node}'")
        self.used_bytes -= size
        insort(self._free, (addr, size))
        merged: list[tuple[int, int]] = []
        for a, s in self._free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((a, s))
        self._free = merged


class Memories:
    """The allocators of a machine's memory nodes, created as they are first used."""

    def __init__(self, machine):
        self.machine = machine
        self.allocators: dict[str, Allocator] = {}

    def node(self, pe: int, level: str) -> str:
        """The memory node of PE ``pe`` at ``level``."""
        if level not in LEVELS:
            raise ValueError(f"unknown memory level '{level}' (expected one of {', '.join(LEVELS)})")
        node = self.machine.memory(pe, level)
        if node is None:
            raise ValueError(f"PE {pe} has no {level} in topology '{self.machine.name}'")
        return node

    def allocator(self, node: str) -> Allocator:
        a = self.allocators.get(node)
        if a is None:
            m = self.machine
            a = self.allocators[node] = Allocator(node, m.node_capacity(node), m.granule(node))
        return a

    def alloc(self, pe: int, level: str, nbytes: int, name: str = "") -> Buf:
        """A new buffer ``name`` of ``nbytes`` bytes in PE ``pe``'s memory at ``level``."""
        node = self.node(pe, level)
        return Buf(name, level, pe, node, self.allocator(node).alloc(nbytes), nbytes)

    def free(self, buf: Buf) -> None:
        self.allocator(buf.node).free(buf.addr)
