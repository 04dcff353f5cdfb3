"""HBM book-keeping of ahbm tensors: one book per machine, one allocator per HBM node.

A tensor placed by ``Spec`` takes, on every PE of its mesh, its size divided by the mesh
dimensions it is sharded over (``Replicate`` and ``Partial`` keep a full-size buffer). A
memory node shared by several PEs (a die-wide HBM) holds the parts of all of them, out of
its one capacity (``machine.memory(pe, "hbm")``, ``machine.node_capacity``). Blocks come
from the runtime's ``Memories`` (one memory model). A tensor that does not fit raises
``HbmFull`` naming the tensor, the PE and the bytes, and leaves the book as it was. Blocks
return when the tensor is garbage-collected.

NOTE: views do not take bytes of their own; a view that outlives its base is not counted
(the base's bytes are returned when the base wrapper goes).
"""
from __future__ import annotations

import weakref
from math import prod

from ..runtime.memory import AllocationError, Memories
from .placement import Shard


class HbmFull(MemoryError):
    """A tensor does not fit in the HBM left on some PE."""


class HbmBook:
    """The HBM of one machine: an ``Allocator`` per memory node."""

    def __init__(self, machine):
        self.machine = machine
        memories = Memories(machine)
        self.nodes = {node: memories.allocator(node) for node in dict.fromkeys(pe.hbm for pe in machine.pes)}

    def free(self, pe: int) -> int:
        """Bytes free in PE ``pe``'s HBM node (shared with its other PEs)."""
        return self.nodes[self.machine.memory(pe, "hbm")].free_bytes

    @staticmethod
    def per_pe(spec, nbytes: int) -> int:
        split = prod(spec.mesh.shape[d] for d, p in enumerate(spec.placements) if isinstance(p, Shard))
        return -(-nbytes // split)

    def reserve(self, owner, spec, shape: tuple, nbytes: int) -> None:
        """Take ``nbytes`` placed by ``spec`` for ``owner`` (released when it is collected)."""
        need = self.per_pe(spec, nbytes)
        if need == 0:
            return
        demand: dict = {}
        for pe in spec.mesh.pes:
            node = self.machine.memory(pe, "hbm")
            demand.setdefault(node, [pe, 0])[1] += need
        taken = []
        for node, (pe, size) in demand.items():
            try:
                taken.append((node, self.nodes[node].alloc(size)))
            except AllocationError:
                self._release(taken)
                free = self.nodes[node].free_bytes
                raise HbmFull(f"ahbm: a tensor of shape {tuple(shape)} ({nbytes} bytes, {need} per PE as "
                              f"{list(spec.placements)}) does not fit in PE {pe}'s HBM ('{node}'): {free} of "
                              f"{self.nodes[node].capacity} bytes free") from None
        weakref.finalize(owner, self._release, taken)

    def _release(self, taken: list) -> None:
        for node, addr in taken:
            self.nodes[node].free(addr)


_BOOKS: dict = {}


def hbm_book(machine) -> HbmBook:
    """The HBM book of ``machine`` (one per machine and process)."""
    # NOTE: keyed by the Machine object (hashed by identity): a machine loaded from another
    # file, or another version of it, has a book of its own.
    if machine not in _BOOKS:
        _BOOKS[machine] = HbmBook(machine)
    return _BOOKS[machine]
