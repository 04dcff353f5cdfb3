"""First-fit allocation of byte ranges inside one memory node (HBM slice, SRAM or TCM).

Addresses and sizes are bytes. Every block starts on an ``ALIGN``-byte boundary and is
rounded up to a multiple of it. Free space is a sorted list of ``(addr, size)`` extents,
merged with its neighbours when a block is freed.
"""
from __future__ import annotations

from bisect import insort

ALIGN = 256
_MIB, _GIB = 1 << 20, 1 << 30


class AllocationError(ValueError):
    """A request that does not fit; the allocator is left unchanged."""


def capacity_bytes(node: str, attrs: dict) -> int:
    """Allocatable bytes of a memory node from its graph attributes.

    ``capacity_gib`` or ``capacity_mib``; a TCM keeps ``scratch_mib`` for kernels.
    """
    p = attrs.get("params", {})
    if "capacity_gib" in p:
        total = round(p["capacity_gib"] * _GIB)
    elif "capacity_mib" in p:
        total = round(p["capacity_mib"] * _MIB)
    else:
        raise ValueError(f"memory node '{node}' declares no capacity_gib or capacity_mib")
    return total - round(p.get("scratch_mib", 0) * _MIB)


class Allocator:
    """Blocks of one memory node of ``capacity`` bytes."""

    def __init__(self, node: str, capacity: int):
        self.node, self.capacity = node, capacity
        self._free: list[tuple[int, int]] = [(0, capacity)] if capacity > 0 else []
        self._used: dict[int, int] = {}

    @property
    def free_bytes(self) -> int:
        return sum(size for _, size in self._free)

    @property
    def largest_free(self) -> int:
        return max((size for _, size in self._free), default=0)

    def alloc(self, nbytes: int) -> int:
        """The address of a new block of at least ``nbytes`` bytes (first fit)."""
        if nbytes <= 0:
            raise ValueError(f"cannot allocate {nbytes} bytes in '{self.node}': size must be positive")
        size = -(-nbytes // ALIGN) * ALIGN
        for i, (addr, extent) in enumerate(self._free):
            if extent >= size:
                if extent == size:
                    del self._free[i]
                else:
                    self._free[i] = (addr + size, extent - size)
                self._used[addr] = size
                return addr
        raise AllocationError(f"cannot allocate {nbytes} bytes in '{self.node}': {self.free_bytes} bytes free "
                              f"(largest free block {self.largest_free} bytes, capacity {self.capacity})")

    def free(self, addr: int) -> None:
        """Release the block at ``addr``."""
        size = self._used.pop(addr, None)
        if size is None:
            raise ValueError(f"no block allocated at address {addr} in '{self.node}'")
        insort(self._free, (addr, size))
        merged: list[tuple[int, int]] = []
        for a, s in self._free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((a, s))
        self._free = merged
