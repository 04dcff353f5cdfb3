"""The host-facing runtime: allocation, deployment, launch and run."""
import numpy as np
import pytest

from kbtorch.runtime import AllocationError, Allocator, Runtime

ALIGN = 256  # the burst of an AHBM HBM slice and the flit: the allocation granule there
from kbtorch.sim.commands import Dma, Loc, Wait
from kbtorch.sim.simulator import SimulationStuck

MIB = 1 << 20


@pytest.fixture
def rt(ahbm):
    return Runtime(ahbm)


def test_capacities_from_node_params(rt):
    assert rt.allocator(rt.memory_node(0, "hbm")).capacity == 6 << 30
    assert rt.allocator(rt.memory_node(0, "tcm")).capacity == 15 * MIB
    assert rt.allocator(rt.memory_node(0, "sram")).capacity == 32 * MIB


def test_sram_is_shared_by_the_pes_of_a_cube(rt):
    a, b = rt.alloc(0, 1000, "sram"), rt.alloc(1, 1000, "sram")
    assert a.node == b.node and b.addr == a.addr + 1024


def test_alloc_aligns_and_first_fit_reuses_freed_space(rt):
    a, b, c = (rt.alloc(3, n, "tcm") for n in (100, 300, 256))
    assert [x.addr for x in (a, b, c)] == [0, ALIGN, 3 * ALIGN]
    rt.free(b)
    assert rt.alloc(3, 512, "tcm").addr == ALIGN
    rt.free(a)
    assert rt.alloc(3, 200, "tcm").addr == 0


def test_free_merges_neighbours():
    al = Allocator("m", 4096, ALIGN)
    blocks = [al.alloc(1024) for _ in range(4)]
    for addr in (blocks[1], blocks[3], blocks[2], blocks[0]):
        al.free(addr)
    assert al.free_bytes == al.largest_free == 4096
    assert al.alloc(4096) == 0


def test_capacity_error_leaves_allocator_unchanged(rt):
    node = rt.memory_node(5, "tcm")
    rt.alloc(5, 10 * MIB, "tcm")
    al = rt.allocator(node)
    before = (al.free_bytes, al.largest_free, list(al._free), dict(al._used))
    with pytest.raises(AllocationError, match=rf"{6 * MIB} bytes in '{node}': {5 * MIB} bytes free"):
        rt.alloc(5, 6 * MIB, "tcm")
    assert (al.free_bytes, al.largest_free, list(al._free), dict(al._used)) == before
    assert rt.alloc(5, 5 * MIB, "tcm").addr == 10 * MIB


def test_free_unknown_buffer_errors(rt):
    buf = rt.alloc(0, 4096)
    rt.free(buf)
    with pytest.raises(ValueError, match="not allocated"):
        rt.free(buf)
    with pytest.raises(ValueError, match="no block allocated at address 64"):
        Allocator("m", 4096, ALIGN).free(64)


def test_bad_alloc_arguments(rt):
    with pytest.raises(ValueError, match="PE 256"):
        rt.alloc(256, 4096)
    with pytest.raises(ValueError, match="'dram'"):
        rt.alloc(0, 4096, "dram")
    with pytest.raises(ValueError, match="positive"):
        rt.alloc(0, 0)


def test_deploy_read_round_trip(rt):
    buf = rt.alloc(7, 64)
    assert not rt.read(buf).any()
    data = np.arange(8, dtype=np.float32)
    rt.deploy(buf, data)
    out = rt.read(buf)
    assert out.dtype == np.uint8 and out.size == 64
    assert np.array_equal(out[:32].view(np.float32), data) and not out[32:].any()
    rt.deploy(buf, b"\x01\x02")
    assert list(rt.read(buf)[:3]) == [1, 2, 0]
    with pytest.raises(ValueError, match="65 bytes"):
        rt.deploy(buf, bytes(65))


def test_buffer_loc(rt):
    buf = rt.alloc(2, 1024, "tcm")
    assert buf.loc(256) == Loc(buf.node, buf.addr + 256)
    with pytest.raises(ValueError, match="offset 1024"):
        buf.loc(1024)


def test_launch_and_run_a_dma(rt):
    src, dst = rt.alloc(0, 64 << 10), rt.alloc(0, 64 << 10, "tcm")
    rt.launch(0, [Dma(src.loc(), dst.loc(), 64 << 10)])
    result = rt.run()
    assert result.latency_ns > (64 << 10) / 256
    assert rt.run().latency_ps == 0


def test_launch_checks_the_pe(rt):
    with pytest.raises(ValueError, match="PE 999"):
        rt.launch(999, [])


def test_stuck_command_is_named(rt):
    src, dst = rt.alloc(1, 4096), rt.alloc(1, 4096, "tcm")
    rt.launch(1, [Dma(src.loc(), dst.loc(), 4096, waits=(Wait("never"),), label="orphan-dma")])
    with pytest.raises(SimulationStuck, match="orphan-dma.*'never'"):
        rt.run()
