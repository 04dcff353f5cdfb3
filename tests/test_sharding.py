"""Sharding propagation on the ahbm device: result placements, the collectives they need, values."""
import pytest
import torch
import torch.nn.functional as F

import kbtorch
from kbtorch import Mesh, Partial, Replicate, Shard, distribute_tensor

P = 16
MESH = Mesh(tuple(range(P)), (P,))


def _names(prof):
    return [r.name for r in prof.records]


def test_elementwise_keeps_the_shard_and_uses_replicated_inputs_locally():
    x, b = torch.randn(64, 512), torch.randn(512)
    xs, bs = distribute_tensor(x, MESH, [Shard(0)]), distribute_tensor(b, MESH, [Replicate()])
    with kbtorch.profile() as prof:
        y = xs + bs
    assert y.placements == (Shard(0),) and _names(prof) == ["aten::add"]
    assert torch.allclose(y.cpu(), x + b)


def test_an_input_sharded_on_another_dimension_is_gathered_first():
    x, z = torch.randn(64, 512), torch.randn(64, 512)
    xs, zs = distribute_tensor(x, MESH, [Shard(0)]), distribute_tensor(z, MESH, [Shard(1)])
    with kbtorch.profile() as prof:
        y = xs * zs
    assert y.placements == (Shard(0),)
    assert _names(prof) == ["redistribute Shard(1)->Replicate()", "aten::mul"]
    assert torch.allclose(y.cpu(), x * z)


def test_rowwise_ops_gather_only_when_they_reduce_the_sharded_dimension():
    x = torch.randn(64, 512)
    xs = distribute_tensor(x, MESH, [Shard(0)])
    with kbtorch.profile() as prof:
        rows = torch.softmax(xs, dim=-1)
        mean = xs.mean(dim=1)
    assert rows.placements == (Shard(0),) and mean.placements == (Shard(0),)
    assert _names(prof) == ["aten::_softmax", "aten::mean"]
    with kbtorch.profile() as prof:
        cols = torch.softmax(xs, dim=0)
    assert cols.placements == (Replicate(),) and _names(prof)[0] == "redistribute Shard(0)->Replicate()"
    assert torch.allclose(cols.cpu(), torch.softmax(x, dim=0), atol=1e-6)


def test_partial_is_reduced_when_used_small_by_all_reduce_large_by_reduce_scatter():
    small, large = torch.randn(4, 64), torch.randn(64, 512)
    with kbtorch.profile() as prof:
        a = distribute_tensor(small, MESH, [Partial()]) + distribute_tensor(small, MESH, [Replicate()])
        b = distribute_tensor(large, MESH, [Partial()]) * 2.0
    assert a.placements == (Replicate(),) and b.placements == (Shard(0),)
    assert _names(prof) == ["redistribute Partial()->Replicate()", "aten::add",
                            "redistribute Partial()->Shard(0)", "aten::mul"]
    assert torch.allclose(a.cpu(), 2 * small) and torch.allclose(b.cpu(), 2 * large)


def test_column_parallel_needs_a_replicated_input():
    x, w = torch.randn(64, 128), torch.randn(256, 128)
    xs, ws = distribute_tensor(x, MESH, [Shard(0)]), distribute_tensor(w, MESH, [Shard(0)])
    with kbtorch.profile() as prof:
        y = F.linear(xs, ws)
    assert y.placements == (Shard(1),)
    assert _names(prof) == ["redistribute Shard(0)->Replicate()", "aten::mm"]
    assert "column-parallel" in prof.records[1].detail
    assert torch.allclose(y.cpu(), x @ w.t(), atol=1e-3)


def test_a_partial_is_reduced_before_a_widening_cast_and_kept_by_a_narrowing_one():
    small, large = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, 512, dtype=torch.bfloat16)
    with kbtorch.profile() as prof:
        a = distribute_tensor(small, MESH, [Partial()]).float()
        b = distribute_tensor(large, MESH, [Partial()]).to(torch.float32)
    assert a.placements == (Replicate(),) and b.placements == (Shard(0),)
    assert _names(prof) == ["redistribute Partial()->Replicate()", "aten::_to_copy",
                            "redistribute Partial()->Shard(0)", "aten::_to_copy"]
    # NOTE: the reductions run on the bf16 input (2 bytes an element), not the fp32 result.
    assert prof.records[2].bytes == large.numel() * 2
    assert torch.equal(a.cpu(), small.float()) and torch.equal(b.cpu(), large.float())
    with kbtorch.profile() as prof:
        c = distribute_tensor(large.float(), MESH, [Partial()]).to(torch.bfloat16)
    assert c.placements == (Partial(),) and _names(prof) == ["aten::_to_copy"]


def test_a_sharded_tensor_cast_stays_sharded():
    x = torch.randn(64, 512, dtype=torch.bfloat16)
    with kbtorch.profile() as prof:
        y = distribute_tensor(x, MESH, [Shard(1)]).float()
    assert y.placements == (Shard(1),) and _names(prof) == ["aten::_to_copy"]


def test_a_sum_or_mean_over_the_sharded_dimension_is_partial_and_reduced_when_used():
    """An RMSNorm of a hidden-sharded activation: each PE sums its part, and only the row
    means are all-reduced (not the activation gathered)."""
    x = torch.randn(64, 512)
    xs = distribute_tensor(x, MESH, [Shard(1)])
    with kbtorch.profile() as prof:
        var = xs.pow(2).mean(-1, keepdim=True)
        y = xs * torch.rsqrt(var + 1e-6)
    assert var.placements == (Partial(),) and y.placements == (Shard(1),)
    assert _names(prof) == ["aten::pow", "aten::mean", "redistribute Partial()->Replicate()", "aten::add",
                            "aten::rsqrt", "aten::mul"]
    assert torch.allclose(y.cpu(), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), atol=1e-5)
    with kbtorch.profile() as prof:
        top = xs.softmax(-1)
    assert top.placements == (Replicate(),) and _names(prof)[0] == "redistribute Shard(1)->Replicate()"
    assert prof.records[0].bytes >= x.numel() * 4


@pytest.mark.parametrize("norm", ["rms_norm", "layer_norm"])
def test_a_norm_over_the_sharded_dimension_all_reduces_row_statistics_and_stays_sharded(norm):
    x, w = torch.randn(64, 512), torch.randn(512)
    f = getattr(torch.nn.functional, norm)
    with kbtorch.profile() as prof:
        y = f(distribute_tensor(x, MESH, [Shard(1)]), (512,), distribute_tensor(w, MESH, [Replicate()]))
    assert y.placements == (Shard(1),)
    assert _names(prof) == ["redistribute Partial()->Replicate()", f"aten::{norm}"]
    # NOTE: the statistics (fp32 per row: 1 for rms_norm, 2 for layer_norm) move, not the activation.
    stats = {"rms_norm": 1, "layer_norm": 2}[norm]
    assert prof.records[0].bytes < 64 * stats * 4 * 2 * len(MESH.pes)
    torch.testing.assert_close(y.cpu(), f(x, (512,), w))


@pytest.mark.parametrize("op", ["amax", "argmax", "max"])
def test_a_pick_over_the_sharded_dimension_gathers_each_pes_winners_only(op):
    x = torch.randn(4, 4096)
    with kbtorch.profile() as prof:
        got = getattr(distribute_tensor(x, MESH, [Shard(1)]), op)(-1)
    want = getattr(x, op)(-1)
    for g, w in zip(got if op == "max" else (got,), want if op == "max" else (want,)):
        assert g.placements == (Replicate(),) and torch.equal(g.cpu(), w)
    assert _names(prof) == ["redistribute Shard(0)->Replicate()", f"aten::{op}"]
    # NOTE: a value and an index per row and PE move, not the rows.
    assert prof.records[0].bytes <= 4 * 2 * 4 * len(MESH.pes) * 2
