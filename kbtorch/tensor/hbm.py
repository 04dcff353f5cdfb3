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

import functools
import weakref
from math import prod

from ..runtime.allocator import AllocationError, Memories
from ..topology import TopologyError, current_machine
from .placement.spec import Shard, default_spec
from .. import state


class HbmFull(MemoryError):
    """A tensor does not fit in the HBM left on some PE."""


class HbmBook:
    """The HBM of one machine: an ``Allocator`` per memory node, shared by nodes whose
    allocations have been the same so far.

    NOTE: a tensor on a mesh of every PE takes the same bytes on every node, so the nodes'
    allocators stay identical: one shared allocator does for all of them (one allocation a
    tensor, not one a node). A tensor on some of the nodes first gives them an allocator of
    their own (a clone), so each node's blocks are always exactly its own."""

    def __init__(self, machine):
        self.machine = machine
        memories = Memories(machine)
        self.nodes: dict = {}
        self.members: dict = {}            # id(allocator) -> the nodes it serves
        bare = [pe.id for pe in machine.pes if pe.hbm is None]
        if bare:
            raise TopologyError(machine.path, "bind", f"PE {bare[0]} has no HBM (no bind entry with attr = \"hbm\" "
                                f"for it; {len(bare)} of {len(machine.pes)} PEs have none): the ahbm device keeps "
                                "tensors in its PEs' HBM")
        for node in dict.fromkeys(pe.hbm for pe in machine.pes):
            a = memories.allocator(node)
            twin = next((b for b in self.nodes.values() if (b.capacity, b.align) == (a.capacity, a.align)), None)
            self.nodes[node] = twin or a
            self.members.setdefault(id(self.nodes[node]), set()).add(node)
        self.exact = {frozenset(m): self.nodes[next(iter(m))] for m in self.members.values()}
        self._busy, self._pending = False, []

    def peaks(self) -> dict[int, int]:
        """``{chip: bytes}``: the most bytes any one HBM node of each chip has held (since
        ``reset_peaks``), as ``torch.cuda.max_memory_allocated`` per device."""
        out: dict = {}
        for pe in self.machine.pes:
            chip = self.machine.chip_of(pe.id)
            out[chip] = max(out.get(chip, 0), self.nodes[pe.hbm].peak_bytes)
        return out

    def reset_peaks(self) -> None:
        for a in {id(a): a for a in self.nodes.values()}.values():
            a.reset_peak()

    def free(self, pe: int) -> int:
        """Bytes free in PE ``pe``'s HBM node (shared with its other PEs)."""
        return self.nodes[self.machine.memory(pe, "hbm")].free_bytes

    @staticmethod
    def per_pe(spec, nbytes: int) -> int:
        split = prod(spec.mesh.shape[d] for d, p in enumerate(spec.placements) if isinstance(p, Shard))
        return -(-nbytes // split)

    @state.cache

    @functools.lru_cache(maxsize=256)
    def _spread(self, pes: tuple) -> tuple:
        """``((PEs per node, nodes), ...)``: the HBM nodes of ``pes`` grouped by how many of
        the PEs each holds."""
        count: dict = {}
        for pe in pes:
            node = self.machine.memory(pe, "hbm")
            count[node] = count.get(node, 0) + 1
        groups: dict = {}
        for node, n in count.items():
            groups.setdefault(n, set()).add(node)
        return tuple((n, frozenset(nodes)) for n, nodes in groups.items())

    def _serving(self, nodes: frozenset) -> list:
        """The allocators of ``nodes``, each serving none but some of them (split off if needed)."""
        if nodes in self.exact:
            return [self.exact[nodes]]
        out = {}
        for node in nodes:
            a = self.nodes[node]
            if id(a) in out:
                continue
            members = self.members[id(a)]
            if not members <= nodes:
                mine = members & nodes
                del self.exact[frozenset(members)]
                members -= mine
                self.exact[frozenset(members)] = a
                a = a.clone()
                self.members[id(a)] = mine
                self.exact[frozenset(mine)] = a
                for n in mine:
                    self.nodes[n] = a
            out[id(a)] = a
        return list(out.values())

    def reserve(self, owner, spec, shape: tuple, nbytes: int) -> None:
        """Take ``nbytes`` placed by ``spec`` for ``owner`` (released when it is collected)."""
        need = self.per_pe(spec, nbytes)
        if need == 0:
            return
        taken = []
        self._busy = True
        try:
            for count, nodes in self._spread(tuple(spec.mesh.pes)):
                size = count * need
                for a in self._serving(nodes):
                    try:
                        taken.append((frozenset(self.members[id(a)]), a.alloc(size)))
                    except AllocationError:
                        self._free(taken)
                        raise self._full(spec, shape, nbytes, need) from None
        finally:
            self._busy = False
            self._drain()
        weakref.finalize(owner, self._release, taken)

    def _full(self, spec, shape: tuple, nbytes: int, need: int) -> HbmFull:
        """The error naming the first PE of the mesh (in its order) whose HBM cannot hold its part."""
        sizes = {node: count * need for count, nodes in self._spread(tuple(spec.mesh.pes)) for node in nodes}
        pe = next(p for p in spec.mesh.pes if self.nodes[self.machine.memory(p, "hbm")].largest_free
                  < sizes[self.machine.memory(p, "hbm")])
        node = self.machine.memory(pe, "hbm")
        a = self.nodes[node]
        return HbmFull(f"ahbm: a tensor of shape {tuple(shape)} ({nbytes} bytes, {need} per PE as "
                       f"{list(spec.placements)}) does not fit in PE {pe}'s HBM ('{node}'): "
                       f"{a.free_bytes} of {a.capacity} bytes free")

    def check_fits(self, what: str, tensors: list, place) -> None:
        """Raise ``HbmFull`` before anything is allocated if ``tensors`` (``(name, shape,
        nbytes)`` in order), each placed by ``place(shape)``, would not all fit in the HBM
        free now: it names the first tensor past some node's free bytes, the node, its PE,
        the machine and the bytes ``what`` needs in all."""
        used: dict = {}
        total = sum(nbytes for _, _, nbytes in tensors)
        for name, shape, nbytes in tensors:
            spec = place(shape)
            need = self.per_pe(spec, nbytes)
            if not need:
                continue
            for node, (count, pe) in self._in_order(tuple(spec.mesh.pes)).items():
                a = self.nodes[node]
                used[node] = used.get(node, 0) + -(-count * need // a.align) * a.align
                if used[node] > a.free_bytes:
                    raise HbmFull(f"ahbm: {what} does not fit the HBM of '{self.machine.name}' "
                                  f"({total / 1e9:.1f} GB in all): '{name}' {tuple(shape)} is the first past the "
                                  f"{a.free_bytes / 1e9:.1f} GB free of {a.capacity / 1e9:.1f} GB in HBM node "
                                  f"'{node}' (PE {pe}); nothing was moved")

    @state.cache

    @functools.lru_cache(maxsize=64)
    def _in_order(self, pes: tuple) -> dict:
        """HBM node -> (how many of ``pes`` it serves, the first of them), in the order of ``pes``."""
        out: dict = {}
        for pe in pes:
            node = self.machine.memory(pe, "hbm")
            count, first = out.get(node, (0, pe))
            out[node] = (count + 1, first)
        return out

    def _release(self, taken: list) -> None:
        """A collected owner's blocks freed, or queued while the book is mid-change.

        NOTE: the collector runs finalizers wherever an allocation triggers it, also inside
        ``reserve`` while an allocator is being split (``exact`` and ``nodes`` half updated)
        or inside an allocator's own free: a release then freed the wrong allocators and left
        blocks behind (seen as frees of blocks no longer there, in the full test suite)."""
        self._pending.append(taken)
        self._drain()

    def _drain(self) -> None:
        while self._pending and not self._busy:
            self._busy = True
            try:
                self._free(self._pending.pop())
            finally:
                self._busy = False

    def _free(self, taken: list) -> None:
        for nodes, addr in taken:
            whole = self.exact.get(nodes)
            for a in [whole] if whole is not None else {id(self.nodes[n]): self.nodes[n] for n in nodes}.values():
                a.free(addr)


_BOOKS: dict = state.cache({}, "kbtorch.tensor.hbm._BOOKS")


def hbm_book(machine) -> HbmBook:
    """The HBM book of ``machine`` (one per machine and process)."""
    # NOTE: keyed by the Machine, equal by content (``Machine.digest``): two objects of the
    # same content share one book; another version of a file has a book of its own.
    if machine not in _BOOKS:
        _BOOKS[machine] = HbmBook(machine)
    return _BOOKS[machine]


def check_hbm(what: str, tensors: list) -> None:
    """``HbmFull`` before anything is allocated if ``tensors`` (``(name, shape, nbytes)`` in
    order), each placed as a new ahbm tensor is by default (``default_spec``: over the PEs of
    the current machine, or of the scope's), would not all fit in the HBM free now; nothing
    is booked either way (``HbmBook.check_fits``). ``what`` names them in the error."""
    machine = current_machine()
    hbm_book(machine).check_fits(what, tensors, lambda shape: default_spec(machine, shape))


def hbm_peaks(machine=None) -> dict[int, int]:
    """``{chip: bytes}``: the peak modelled HBM of each chip of ``machine`` (default: the
    current one), the fullest HBM node of the chip, since the last ``reset_hbm_peaks``."""
    return hbm_book(machine or current_machine()).peaks()


def reset_hbm_peaks(machine=None) -> None:
    hbm_book(machine or current_machine()).reset_peaks()
