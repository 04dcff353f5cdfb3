"""Graph mode's overlap pass (``kbtorch.tensor.graph.overlap``): a sequence-parallel MLP on the
tiny machine (8 PEs): all-gather -> column-parallel GEMM, row-parallel GEMM ->
reduce-scatter, split into chunks whose collectives run under their neighbours' GEMMs."""
import torch

import kbtorch
from kbtorch.ops.contract import memory_bytes
from kbtorch.tensor.graph import overlap

S, H, F = 256, 256, 512


def _mlp(x, w1, w2):
    return x + torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, w1)), w2)


def _placed(machine):
    """(fresh sequence-sharded input, column- and row-parallel weights, host values)."""
    mesh = kbtorch.Mesh(tuple(range(len(machine.pes))), (len(machine.pes),))
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(1, S, H), torch.randn(F, H) / 16, torch.randn(H, F) / 16
    xa = kbtorch.distribute_tensor(x.to("ahbm"), mesh, [kbtorch.Shard(1)])
    w1a = kbtorch.distribute_tensor(w1.to("ahbm"), mesh, [kbtorch.Shard(0)])
    w2a = kbtorch.distribute_tensor(w2.to("ahbm"), mesh, [kbtorch.Shard(1)])
    return xa, w1a, w2a, (x, w1, w2)


def _graph(machine, **options):
    xa, w1a, w2a, host = _placed(machine)
    with kbtorch.graph(**options) as g:
        out = _mlp(xa, w1a, w2a)
    return g, out, host


def test_overlap_splits_gemms_beside_collectives_and_keeps_values(small):
    g, out, host = _graph(small)
    plain, out_plain, _ = _graph(small, overlap=False)
    torch.testing.assert_close(out.cpu(), out_plain.cpu())
    torch.testing.assert_close(out.cpu(), _mlp(*host), rtol=2e-3, atol=2e-3)
    kinds = [k.kernel for k in g.plan.kernels]
    assert any(k.startswith("all_gather") and "[chunk 1/" in k for k in kinds)
    assert any(k.startswith("reduce_scatter") and "[chunk 1/" in k for k in kinds)
    assert not any("chunk" in k for k in (k.kernel for k in plain.plan.kernels))
    # work is conserved: the chunks' FLOPs add up to the GEMMs'
    assert sum(k.flops for k in g.plan.kernels) == sum(k.flops for k in plain.plan.kernels)
    assert "[chunk 2/" in g.report()


def test_overlap_is_faster_and_never_beats_its_busiest_resource(small):
    g, _, _ = _graph(small)
    plain, _, _ = _graph(small, overlap=False)
    assert g.latency_ns < plain.latency_ns
    stats = g.schedule.result.stats
    # NOTE: a memory's busy time sums its channels' (each serves its own bursts)
    channels = {n: int(small.graph.nodes[n]["params"].get("channels", 1)) for n in stats["memories"]}
    busiest = max([link["max_busy_ps"] for link in stats["links"].values()]
                  + [m["busy_ps"] / channels[n] for n, m in stats["memories"].items()])
    assert g.schedule.latency_ps >= busiest > 0
    # the GEMM's chunk 2 runs while the gather's later chunk or the reduce's chunk 1 does
    spans = {k.kernel: (r, f) for k, r, f in zip(g.plan.kernels, g.schedule.ready_ps, g.schedule.finish_ps)}
    reduce1 = next(v for k, v in spans.items() if k.startswith("reduce_scatter") and "[chunk 1/" in k)
    gemm2 = [v for k, v in spans.items() if k.startswith("gemm [chunk 2/")][-1]
    assert reduce1[0] < gemm2[1] and gemm2[0] < reduce1[1]
    assert memory_bytes(small, g.schedule.result) > 0


def test_chunk_count_follows_the_estimate():
    # a flow shop: two stages of 4 equal chunks each take 5 stage-times, not 8
    assert overlap.flow_shop([[1, 1, 1, 1], [1, 1, 1, 1]]) == 5
    assert overlap.flow_shop([[4], [4]]) == 8
    assert overlap.flow_shop([[1, 1], [3, 3], [1, 1]]) == 8


def test_no_split_without_a_collective(small):
    w = torch.randn(64, 64).to("ahbm")
    x = torch.randn(32, 64).to("ahbm")
    with kbtorch.graph() as g:
        x @ w
    assert not any("chunk" in k.kernel for k in g.plan.kernels)


def test_a_gemm_reading_an_input_another_op_gathered_waits_for_the_gather(small):
    xa, w1a, _, _ = _placed(small)
    mesh = w1a._spec.mesh
    w3a = kbtorch.distribute_tensor(torch.randn(F, H).to("ahbm"), mesh, [kbtorch.Shard(0)])
    with kbtorch.graph(overlap=False) as g:
        a = torch.nn.functional.linear(xa, w1a)
        b = torch.nn.functional.linear(xa, w3a)
    kinds = [k.kernel for k in g.plan.kernels]
    gather = kinds.index(next(k for k in kinds if k.startswith("all_gather")))
    assert kinds.count(kinds[gather]) == 1 and a.shape == b.shape
    assert all(gather in k.deps for k in g.plan.kernels if k.kernel == "gemm")
