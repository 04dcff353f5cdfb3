"""The device's HBM book: nodes with the same history share an allocator, and each node's
free bytes are always exactly its own."""
import gc

import pytest
import torch

import kbtorch
from kbtorch.tensor.hbm import HbmBook, HbmFull
from kbtorch.tensor.placement.mesh import Mesh
from kbtorch.tensor.placement.spec import Replicate, Shard, Spec


class Owner:
    pass


def test_shared_allocators_split_when_histories_diverge(ahbm):
    book = HbmBook(ahbm)
    assert len({id(a) for a in book.nodes.values()}) == 1          # 256 identical slices, one allocator
    everywhere = Spec(Mesh(tuple(range(256)), (256,)), (Replicate(),))
    some = Spec(Mesh(tuple(range(8)), (8,)), (Shard(0),))
    a, b, c = Owner(), Owner(), Owner()
    book.reserve(a, everywhere, (1024,), 4096)
    book.reserve(b, some, (8, 1024), 8 * 8192)
    book.reserve(c, everywhere, (1024,), 4096)
    cap = ahbm.node_capacity(ahbm.pes[0].hbm)
    assert [book.free(pe) for pe in (0, 7, 8, 255)] == [cap - 8192 - 8192, cap - 8192 - 8192, cap - 8192, cap - 8192]
    del b
    gc.collect()
    assert {book.free(pe) for pe in range(256)} == {cap - 8192}
    del a, c
    gc.collect()
    assert {book.free(pe) for pe in range(256)} == {cap}


def test_a_refused_tensor_leaves_the_book_unchanged(ahbm):
    book = HbmBook(ahbm)
    keep = Owner()
    book.reserve(keep, Spec(Mesh(tuple(range(8)), (8,)), (Replicate(),)), (16,), 1 << 30)
    before = [book.free(pe) for pe in range(256)]
    with pytest.raises(HbmFull, match="does not fit in PE 0's HBM"):
        book.reserve(Owner(), Spec(Mesh(tuple(range(256)), (256,)), (Replicate(),)), (4,), 6 << 30)
    assert [book.free(pe) for pe in range(256)] == before


def test_a_shared_memory_holds_the_parts_of_all_its_pes():
    die = kbtorch.topology.load_machine("tests/data/diewide.toml")
    book, owner = HbmBook(die), Owner()
    book.reserve(owner, Spec(Mesh(tuple(range(8)), (8,)), (Shard(0),)), (8, 1024), 8 * 1024 * 4)
    assert book.free(3) == die.node_capacity("hbm") - 8 * 4096


def test_a_machine_whose_pes_have_no_hbm_is_refused_by_name(tiny_path, write_topology):
    """It failed with a bare KeyError (None) at the first tensor moved to the device."""
    from kbtorch.topology import TopologyError
    line = '  { array = "pe", attr = "hbm", nodes = ["hs0", "hs1"] },\n'
    text = tiny_path.read_text()
    assert line in text
    path = write_topology(text.replace(line, ""))
    with kbtorch.use(str(path)):
        with pytest.raises(TopologyError, match=r"bind: PE 0 has no HBM .*8 of 8 PEs") as err:
            torch.ones(4).to("ahbm")
    assert err.value.path == str(path)


def test_a_release_the_collector_runs_inside_a_reserve_waits_for_it(ahbm, monkeypatch):
    """The collector runs finalizers wherever an allocation triggers it: here an owner dies
    while a reserve is splitting an allocator. Its blocks are freed once the book is whole
    again, and every node ends with all its bytes free (a release midway freed the wrong
    allocators: frees of blocks no longer there, seen in the full test suite)."""
    from kbtorch.runtime.allocator import Allocator
    book = HbmBook(ahbm)
    cap = ahbm.node_capacity(ahbm.pes[0].hbm)
    everywhere = Spec(Mesh(tuple(range(256)), (256,)), (Replicate(),))
    some = Spec(Mesh(tuple(range(8)), (8,)), (Shard(0),))
    first, second = Owner(), Owner()
    book.reserve(first, everywhere, (1024,), 4096)
    clone = Allocator.clone

    def dying(self):
        nonlocal first
        copy = clone(self)
        first = None                        # its finalizer runs now: the clone is not yet in the book
        return copy
    monkeypatch.setattr(Allocator, "clone", dying)
    book.reserve(second, some, (8, 1024), 8 * 8192)
    monkeypatch.setattr(Allocator, "clone", clone)
    assert [book.free(pe) for pe in (0, 8)] == [cap - 8192, cap]
    del second
    gc.collect()
    assert {book.free(pe) for pe in range(256)} == {cap}
