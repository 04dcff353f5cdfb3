"""Device meshes over a system of chips: init_device_mesh, sub-meshes, 2-D matmul placements
against CPU, and which collectives (inside a chip, across chips) their reductions run."""
import itertools

import pytest
import torch

import kbtorch
from kbtorch import Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from kbtorch.tensor.redistribute import steps
from kbtorch.topology import load_machine

from conftest import DATA


@pytest.fixture(scope="module")
def system():
    """tiny_system: 4 chips x 4 PEs."""
    return load_machine(str(DATA / "tiny_system.toml"))


def test_the_default_mesh_is_chips_by_pes(system):
    mesh = init_device_mesh(machine=system)
    assert mesh.shape == (4, 4) and mesh.names == ("chip", "pe") and mesh.pes == tuple(range(16))
    assert mesh.size() == 16 and mesh.size("pe") == 4 and mesh.ndim == 2
    assert all(system.chip_of(p) == i for i in range(4) for p in mesh.pes[4 * i:4 * i + 4])
    other = init_device_mesh((2, 2, 4), ("tray", "chip", "pe"), machine=system)
    assert other.shape == (2, 2, 4) and [system.chip_of(p) for p in other.pes[::4]] == [0, 1, 2, 3]
    assert init_device_mesh((16,), ("all",), machine=system).shape == (16,)


@pytest.mark.parametrize("shape, names, words", [
    ((3, 4), ("chip", "pe"), r"mesh shape \(3, 4\) has 12 PEs; topology 'tiny_system' has 16 PEs \(4 chips x 4 PEs\)"),
    ((4, 4), ("chip",), r"1 mesh_dim_names \('chip',\) for the 2 dimensions of mesh shape \(4, 4\)"),
    ((4, 0), ("chip", "pe"), r"mesh shape \(4, 0\) must be positive"),
    (None, ("a", "b", "c"), r"need a shape"),
])
def test_a_shape_that_does_not_fit_is_refused_by_name(system, shape, names, words):
    with pytest.raises(ValueError, match=words):
        init_device_mesh(shape, names, machine=system)


def test_a_sub_mesh_replicates_along_the_other_dimensions(system):
    mesh = init_device_mesh(machine=system)
    t = torch.randn(8, 16)
    x = distribute_tensor(t, mesh["pe"], [Shard(1)])
    assert x.placements == (Replicate(), Shard(1)) and torch.equal(x.cpu(), t)
    assert mesh["chip"].shape == (4,) and mesh["chip"].names == ("chip",) and mesh[("chip", "pe")].size() == 16
    with pytest.raises(KeyError, match="'chip', 'pe'"):
        mesh["tp"]
    with pytest.raises(ValueError, match="2 placements for the 1-dimensional sub-mesh"):
        distribute_tensor(t, mesh["pe"], [Shard(0), Shard(1)])


PLACEMENTS = (Shard(0), Shard(1), Replicate())


@pytest.mark.parametrize("chip, pe", list(itertools.product(PLACEMENTS, repeat=2)))
def test_2d_matmul_equals_cpu_and_reduces_along_the_right_dimensions(system, chip, pe):
    """``a @ b`` with ``b`` placed (chip, pe): the value is CPU's; the result is Partial along
    exactly the dimensions where ``b`` splits K, and reducing it runs collectives across
    chips only if the chip dimension splits K."""
    mesh = init_device_mesh(machine=system)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 128, generator=g), torch.randn(128, 96, generator=g)
    x, w = distribute_tensor(a, mesh, [Replicate(), Replicate()]), distribute_tensor(b, mesh, [chip, pe])
    with kbtorch.profile() as prof:
        y = x @ w
    expect = {Shard(0): Partial(), Shard(1): Shard(1), Replicate(): Replicate()}
    if (chip, pe) != (Replicate(), Replicate()):
        assert y.placements == (expect[chip], expect[pe])
    assert [r.name for r in prof.records] == ["aten::mm"] and prof.records[0].latency_ns > 0
    settled = [Replicate() if isinstance(p, Partial) else p for p in y.placements]
    with kbtorch.profile() as prof:
        z = y.redistribute(settled)
    assert torch.allclose(z.cpu(), a @ b, atol=1e-4)
    dims = {r.detail.split("'")[1] for r in prof.records}
    assert ("chip" in dims) == (chip == Shard(0)) and ("pe" in dims) == (pe == Shard(0))


def test_per_pe_work_follows_the_placements(system):
    """Splitting N over both dimensions does a quarter of the per-PE work of splitting it
    over chips only (each chip's PEs then repeat their chip's block)."""
    mesh = init_device_mesh(machine=system)
    a, b = torch.randn(128, 256), torch.randn(256, 512)
    x = distribute_tensor(a, mesh, [Replicate(), Replicate()])
    times = {}
    for placed in ([Shard(1), Shard(1)], [Shard(1), Replicate()]):
        with kbtorch.profile() as prof:
            x @ distribute_tensor(b, mesh, placed)
        times[str(placed)] = prof.records[0].latency_ns
    assert times[str([Shard(1), Replicate()])] > 1.5 * times[str([Shard(1), Shard(1)])]


def test_a_2d_partial_reduces_hierarchically(system):
    """(Partial, Partial) -> replicated: reduce-scatter inside each chip, all-reduce of a
    quarter across chips, all-gather inside: the cross-chip collective moves 1/4 of the
    bytes, and the whole is faster than an all-reduce across chips of the full size."""
    mesh = init_device_mesh(machine=system)
    plan = steps(mesh, (Partial(), Partial()), (Replicate(), Replicate()), 4096)
    assert [(d, kind, n) for d, kind, _, _, n in plan] == [
        (1, "reduce_scatter", 4096), (0, "all_reduce", 1024), (1, "all_gather", 4096)]
    t = torch.randn(64, 64)
    times = {}
    for placed in ([Partial(), Partial()], [Partial(), Replicate()]):
        with kbtorch.profile() as prof:
            distribute_tensor(t, mesh, placed).redistribute([Replicate(), Replicate()])
        times[str(placed)] = [(r.detail.split("'")[1], r.latency_ns) for r in prof.records]
    hier, flat = times[str([Partial(), Partial()])], times[str([Partial(), Replicate()])]
    assert [d for d, _ in hier] == ["pe", "chip", "pe"] and [d for d, _ in flat] == ["chip"]
    assert hier[1][1] < flat[0][1]


def test_gathers_run_outermost_first_on_what_a_line_holds(system):
    mesh = init_device_mesh(machine=system)
    plan = steps(mesh, (Shard(0), Shard(0)), (Replicate(), Replicate()), 4096)
    assert [(d, kind, n) for d, kind, _, _, n in plan] == [(0, "all_gather", 1024), (1, "all_gather", 4096)]
    assert steps(init_device_mesh((1, 16), machine=system), (Partial(), Partial()), (Replicate(),) * 2, 64) == [
        (1, "all_reduce", Partial(), Replicate(), 64)]


def test_uniform_placements_keep_the_mesh_through_elementwise_ops(system):
    mesh = init_device_mesh(machine=system)
    t = torch.randn(64, 256)
    x = distribute_tensor(t, mesh, [Shard(1), Shard(1)])
    with kbtorch.profile() as prof:
        y = torch.nn.functional.silu(x) * 2
    assert y.placements == (Shard(1), Shard(1)) and y._spec.mesh == mesh
    assert not [r for r in prof.records if r.name.startswith("redistribute")]
    assert torch.allclose(y.cpu(), torch.nn.functional.silu(t) * 2)


def test_a_replica_is_the_mesh_at_one_coordinate(system):
    mesh = init_device_mesh((2, 2, 4), ("dp", "chip", "pe"), machine=system)
    one = kbtorch.replica(mesh, "dp", 1)
    assert one.pes == tuple(range(8, 16)) and one.shape == (2, 4) and one.names == ("chip", "pe")
    assert kbtorch.replica(mesh, "pe", 0).pes == tuple(range(0, 16, 4))
    with pytest.raises(ValueError, match="coordinates 0..1"):
        kbtorch.replica(mesh, "dp", 2)


def test_home_puts_new_tensors_and_unplaced_kernels_on_its_pes(system):
    one = kbtorch.replica(init_device_mesh((2, 2, 4), ("dp", "chip", "pe"), machine=system), "dp")
    a, b = torch.randn(32, 64), torch.randn(64, 48)
    with kbtorch.use(system), kbtorch.home(one):
        x, w = a.to("ahbm"), b.to("ahbm")
        with kbtorch.profile() as prof:
            y = torch.relu(x @ w)
    assert x._spec.mesh.pes == y._spec.mesh.pes == one.pes and torch.allclose(y.cpu(), torch.relu(a @ b), atol=1e-5)
    with kbtorch.use(system):
        with kbtorch.profile() as everywhere:
            torch.relu(a.to("ahbm") @ b.to("ahbm"))
    assert [r.name for r in prof.records] == [r.name for r in everywhere.records]
    assert prof.records[0].latency_ns != everywhere.records[0].latency_ns


def test_reductions_over_a_2d_sharded_dimension_move_only_their_parts(system):
    """Greedy argmax over vocabulary-sharded logits (both dimensions) gathers each PE's
    winners, not the logits; a sum over it is Partial along both dimensions."""
    mesh = init_device_mesh(machine=system)
    t = torch.randn(4, 4096)
    x = distribute_tensor(t, mesh, [Shard(1), Shard(1)])
    with kbtorch.profile() as prof:
        picks = torch.argmax(x, dim=-1)
    assert torch.equal(picks.cpu(), torch.argmax(t, dim=-1))
    moved = [r for r in prof.records if r.name.startswith("redistribute")]
    assert {r.detail.split("'")[1] for r in moved} == {"chip", "pe"}
    assert sum(r.bytes for r in moved) < t.numel() * 4 / 4
    total = x.sum(dim=-1)
    assert total.placements == (Partial(), Partial()) and torch.allclose(total.cpu(), t.sum(dim=-1), atol=1e-3)


def test_a_dimension_smaller_than_the_mesh_lies_as_nested_sharding_deals_it(system):
    """4 heads Shard along (chip, pe) lie one per chip, on its first PE (DTensor's nested
    chunks), not on chip 0's four PEs: a pointwise pass over them runs there."""
    from kbtorch.tensor.timing import vector
    from kbtorch.tensor.placement.mesh import holders
    mesh = init_device_mesh(machine=system)
    assert holders(mesh, 4) == (0, 4, 8, 12) and holders(mesh, 8) == (0, 1, 4, 5, 8, 9, 12, 13)
    assert holders(mesh, 6) == (0, 1, 4, 5, 8, 9) and holders(mesh, 64) == mesh.pes
    assert holders(init_device_mesh((16,), ("all",), machine=system), 4) == (0, 1, 2, 3)
    run = vector(system, "mul", 2 * 4 * 8, placed=Shard(1), pes=mesh, shape=(2, 4, 1, 8))
    assert run.vector.pes == (0, 4, 8, 12)
