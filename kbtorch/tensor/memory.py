"""HBM book-keeping of ahbm tensors: how many bytes each PE's HBM slice holds.

A tensor placed by ``Spec`` takes, on every PE of its mesh, its size divided by the mesh
dimensions it is sharded over (``Replicate`` and ``Partial`` keep a full-size buffer). A
tensor that does not fit on some PE raises ``HbmFull`` naming the tensor, the PE and the
bytes, and leaves the book as it was. Bytes return when the tensor is garbage-collected.

NOTE: views do not take bytes of their own; a view that outlives its base is not counted
(the base's bytes are returned when the base wrapper goes).
"""
from __future__ import annotations

import weakref
from math import prod

from .placement import Shard


class HbmFull(MemoryError):
    """A tensor does not fit in the HBM left on some PE."""


class HbmBook:
    def __init__(self, capacity: dict):
        self.capacity = dict(capacity)
        self.used = {pe: 0 for pe in capacity}

    def per_pe(self, spec, nbytes: int) -> int:
        split = prod(spec.mesh.shape[d] for d, p in enumerate(spec.placements) if isinstance(p, Shard))
        return -(-nbytes // split)

    def reserve(self, owner, spec, shape: tuple, nbytes: int) -> None:
        """Take ``nbytes`` placed by ``spec`` for ``owner`` (released when it is collected)."""
        need = self.per_pe(spec, nbytes)
        for pe in spec.mesh.pes:
            free = self.capacity[pe] - self.used[pe]
            if need > free:
                raise HbmFull(f"ahbm: a tensor of shape {tuple(shape)} ({nbytes} bytes, {need} per PE as "
                              f"{list(spec.placements)}) does not fit in PE {pe}'s HBM: {free} of "
                              f"{self.capacity[pe]} bytes free")
        for pe in spec.mesh.pes:
            self.used[pe] += need
        weakref.finalize(owner, self._release, spec.mesh.pes, need)

    def _release(self, pes, need: int) -> None:
        for pe in pes:
            self.used[pe] -= need
