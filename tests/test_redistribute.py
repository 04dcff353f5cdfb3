"""distribute_tensor / redistribute / full_tensor: placements, values, the timed collectives."""
import pytest
import torch

import kbtorch
from kbtorch import Mesh, Partial, Replicate, Shard, distribute_tensor
from kbtorch.ops.collective import LINE_ALGOS

MESH = Mesh(tuple(range(16)), (2, 8))


@pytest.fixture
def t():
    return torch.randn(64, 32, generator=torch.Generator().manual_seed(0)).half()


def test_distribute_places_without_time(t):
    with kbtorch.profile() as prof:
        x = distribute_tensor(t, MESH, [Replicate(), Shard(0)])
    assert x.placements == (Replicate(), Shard(0)) and prof.records == []
    assert torch.equal(x.cpu(), t)


@pytest.mark.parametrize("src, dst, kind, groups", [
    ([Replicate(), Shard(0)], [Replicate(), Replicate()], "all_gather", 2),
    ([Partial(), Replicate()], [Replicate(), Replicate()], "all_reduce", 8),
    ([Partial(), Replicate()], [Shard(1), Replicate()], "reduce_scatter", 8),
])
def test_redistribute_runs_the_collective(t, src, dst, kind, groups):
    x = distribute_tensor(t, MESH, src)
    with kbtorch.profile() as prof:
        y = x.redistribute(dst)
    assert y.placements == tuple(dst) and torch.equal(y.cpu(), t)
    (rec,) = prof.records
    name, algo, lines = rec.kernel.split()
    assert (name, lines) == (kind, f"x{groups}") and algo in LINE_ALGOS and rec.latency_ns > 0


def test_replicate_to_shard_moves_nothing(t):
    x = distribute_tensor(t, MESH, [Replicate(), Replicate()])
    with kbtorch.profile() as prof:
        y = x.redistribute([Replicate(), Shard(1)])
    assert prof.records == [] and y.placements == (Replicate(), Shard(1))


def test_full_tensor_gathers_every_dimension(t):
    x = distribute_tensor(t, MESH, [Shard(1), Shard(0)])
    with kbtorch.profile() as prof:
        full = x.full_tensor()
    assert torch.equal(full, t) and type(full) is torch.Tensor and len(prof.records) == 2


def test_errors(t):
    x = distribute_tensor(t, MESH, [Replicate(), Shard(0)])
    with pytest.raises(NotImplementedError, match=r"Shard\(0\) -> Partial\(\)"):
        x.redistribute([Replicate(), Partial()])
    with pytest.raises(ValueError, match="Shard"):
        distribute_tensor(t, MESH, [Shard(2), Replicate()])
    with pytest.raises(ValueError, match="outside topology"):
        distribute_tensor(t, Mesh((0, 999), (2,)), [Replicate()])


def test_shard_to_another_shard_gathers_then_keeps_a_part(t):
    x = distribute_tensor(t, MESH, [Replicate(), Shard(0)])
    with kbtorch.profile() as prof:
        y = x.redistribute([Replicate(), Shard(1)])
    assert y.placements == (Replicate(), Shard(1)) and torch.equal(y.cpu(), t)
    assert [r.kernel.split()[0] for r in prof.records] == ["all_gather"]


def test_data_gathered_once_serves_every_view_until_written(t):
    mesh = Mesh(tuple(range(8)), (8,))
    x = distribute_tensor(t, mesh, [Shard(0)])
    with kbtorch.profile() as prof:
        x.view(64, 32).redistribute([Replicate()])
        y = x.view(32, 64).redistribute([Replicate()])          # same data: already everywhere
    assert len(prof.records) == 1 and y.placements == (Replicate(),)
    x.add_(1)                                                    # written: the copies are stale
    with kbtorch.profile() as prof:
        x.view(64, 32).redistribute([Replicate()])
    assert [r.name for r in prof.records] == ["redistribute Shard(0)->Replicate()"]
