"""The device's HBM book: nodes with the same history share an allocator, and each node's
free bytes are always exactly its own."""
import gc

import pytest
import torch

import kbtorch
from kbtorch.tensor.memory import HbmBook, HbmFull
from kbtorch.tensor.placement import Mesh, Replicate, Shard, Spec


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
