"""Fused attention: numerics vs F.scaled_dot_product_attention, the plans, timing sanity, errors."""
import pytest
import torch
import torch.nn.functional as F
from conftest import DATA

from kbtorch.ops.attention import _plan, attention
from kbtorch.ops.attention_plan import (AttentionShape, AttentionTiling, chunk_sizes, decode_plan, prefill_plan,
                                        team_size)
from kbtorch.topology import load_machine

TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}


def qkv(b, hq, hkv, lq, lk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g).to(dtype) for h, n in ((hq, lq), (hkv, lk), (hkv, lk)))


def assert_matches(run, q, k, v, causal, scale=None):
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    assert run.out.dtype == q.dtype and run.out.shape == q.shape
    err = (run.out.float() - ref.float()).abs().max().item()
    assert err <= TOL[q.dtype] * max(1.0, ref.float().abs().max().item()), err


@pytest.mark.parametrize("dims, causal, dtype, pes", [
    ((1, 4, 4, 37, 37, 32), True, torch.float32, 8),       # GQA ratio 1, odd lengths
    ((1, 4, 4, 37, 37, 32), False, torch.float16, 8),
    ((2, 8, 2, 130, 130, 64), True, torch.float16, 16),    # ratio 4
    ((1, 7, 1, 130, 100, 64), False, torch.float32, 16),   # ratio 7, Lq > Lk
    ((1, 14, 2, 37, 130, 64), True, torch.bfloat16, 8),    # ratio 7, causal with Lq < Lk
    ((1, 4, 1, 130, 37, 32), True, torch.float16, 8),      # causal with Lq > Lk
])
def test_prefill_matches_sdpa(ahbm, dims, causal, dtype, pes):
    q, k, v = qkv(*dims, dtype)
    run = attention(q, k, v, is_causal=causal, machine=ahbm, pes=range(pes))
    assert run.kind == "prefill" and run.latency_ns > 0
    assert_matches(run, q, k, v, causal)


@pytest.mark.parametrize("dims, dtype, pes", [
    ((1, 28, 4, 1, 1000, 64), torch.float16, 64),          # Qwen-like heads: 16 PEs per kv head
    ((1, 4, 1, 1, 1000, 64), torch.float32, 16),           # 16 PEs, two teams of 8
    ((1, 4, 1, 1, 1000, 64), torch.float16, 64),           # 56 PEs, seven teams
    ((2, 8, 2, 3, 777, 32), torch.float32, 64),            # small Lq, odd Lk
])
def test_decode_split_matches_sdpa(ahbm, dims, dtype, pes):
    q, k, v = qkv(*dims, dtype, seed=1)
    run = attention(q, k, v, machine=ahbm, pes=range(pes))
    assert run.kind == "decode" and run.tiling.split > 1
    assert_matches(run, q, k, v, False)


def test_explicit_tiling_edge_tiles_scale_and_prime_split(ahbm):
    q, k, v = qkv(1, 6, 2, 37, 37, 32, torch.float32, seed=2)
    run = attention(q, k, v, is_causal=True, scale=0.3, machine=ahbm, pes=range(8),
                    tiling=AttentionTiling(br=5, bc=6, chunk=3, tail=4))
    assert run.tiling.br == 5
    assert_matches(run, q, k, v, True, scale=0.3)
    q, k, v = qkv(1, 2, 1, 1, 300, 32, torch.float32, seed=3)
    run = attention(q, k, v, machine=ahbm, pes=range(13), tiling=AttentionTiling(br=1, bc=8, split=13, fan=4))
    assert len(run.pes) == 13                               # a prime split: teams of one PE
    assert_matches(run, q, k, v, False)
    run = attention(q, k, v, machine=ahbm, pes=range(16), tiling=AttentionTiling(br=1, bc=16, split=16, turns=True))
    assert "turns" in run.plan                              # PEs sharing a controller take turns
    assert_matches(run, q, k, v, False)


def test_prefill_plan_covers_every_block_and_balances_the_causal_triangle():
    shape = AttentionShape(1, 28, 4, 4096, 4096, 128, causal=True, dtype="bf16")
    tiling = AttentionTiling(br=32, bc=128, chunk=8)
    works = prefill_plan(shape, tiling, list(range(256)))
    blocks = sorted((it.b, it.h, it.q0) for w in works for it in w.items)
    assert blocks == [(0, h, q0) for h in range(4) for q0 in range(0, 4096, 32)]
    for w in works:
        for i, it in enumerate(w.items):
            keys = [(c.k0, c.keys) for c in w.chunks if c.item == i]
            assert keys[0][0] == 0 and sum(n for _, n in keys) == it.k1 == it.q1
    loads = [sum(it.positions * it.k1 for it in w.items) for w in works]
    assert max(loads) <= 1.01 * min(loads)                  # block i pairs with block n-1-i


def test_chunk_ramps_and_decode_teams():
    t = AttentionTiling(br=16, bc=128, chunk=8, tail=64)
    assert chunk_sizes(4096, t, up=True, down=True)[:2] == [128, 256]
    assert chunk_sizes(4096, t, up=False, down=True)[-2:] == [128, 64]
    assert sum(chunk_sizes(1000, t, True, True)) == 1000
    assert (team_size(64, 8, 128), team_size(62, 8, 128), team_size(13, 8, 128)) == (8, 2, 1)
    shape = AttentionShape(1, 28, 4, 1, 16384, 128, dtype="bf16")
    works = decode_plan(shape, AttentionTiling(br=1, bc=256, split=64), list(range(256)))
    assert len(works) == 256 and all(w.tree.size == 8 and w.tree.teams == 8 for w in works)
    assert sum(w.items[0].k1 - w.items[0].k0 for w in works[:64]) == 16384


def test_timing_only_and_useful_flops(ahbm):
    run = attention(shape=(1, 4, 2, 100, 100, 64), is_causal=True, dtype="bf16", machine=ahbm, pes=range(16))
    assert run.out is None and run.latency_ns > 0 and run.result.events > 0
    assert run.flops == 4 * 64 * 4 * sum(min(100, i + 1) for i in range(100))
    assert 0 < run.pct_peak <= 100 and 0 < run.pct_hbm <= 100 and run.hbm_bytes > 0
    assert run.analytic_ns > 0 and run.bound_ns <= run.latency_ns


def test_longer_sequences_take_longer_and_causal_is_faster(ahbm):
    def lat(s, causal):
        return attention(shape=(1, 8, 2, s, s, 64), is_causal=causal, machine=ahbm, pes=range(16)).latency_ns
    short, causal, full = lat(256, True), lat(512, True), lat(512, False)
    assert short < causal < full
    dec = [attention(shape=(1, 8, 2, 1, lk, 64), machine=ahbm, pes=range(16)).latency_ns for lk in (1024, 4096)]
    assert dec[0] < dec[1]


def test_decode_is_above_its_bound_and_faster_on_more_pes(ahbm):
    runs = [attention(shape=(1, 8, 2, 1, 4096, 128), dtype="bf16", machine=ahbm, pes=range(p)) for p in (16, 64)]
    for run in runs:
        assert run.kind == "decode" and run.latency_ns >= run.bound_ns > 0
    assert runs[1].latency_ns < runs[0].latency_ns
    assert len(runs[1].pes) == 64 and runs[1].pct_hbm > runs[0].pct_hbm / 4


@pytest.mark.parametrize("kwargs, fault", [
    (dict(q=torch.zeros(2, 4, 8), k=torch.zeros(1, 2, 8, 8), v=torch.zeros(1, 2, 8, 8)), "q must be a 4-d"),
    (dict(q=torch.zeros(1, 3, 8, 8), k=torch.zeros(1, 2, 8, 8), v=torch.zeros(1, 2, 8, 8)), "Hq=3"),
    (dict(q=torch.zeros(1, 2, 8, 8), k=torch.zeros(1, 2, 8, 8).half(), v=torch.zeros(1, 2, 8, 8)), "dtype mismatch"),
    (dict(q=torch.zeros(1, 2, 8, 8), k=torch.zeros(1, 2, 8, 8), v=torch.zeros(1, 2, 9, 8)), "v shape"),
    (dict(q=torch.zeros(1, 2, 8, 8), k=torch.zeros(1, 2, 8, 4), v=torch.zeros(1, 2, 8, 4)), "head dim"),
    (dict(q=torch.zeros(1, 2, 8, 8, dtype=torch.int32), k=torch.zeros(1, 2, 8, 8, dtype=torch.int32),
          v=torch.zeros(1, 2, 8, 8, dtype=torch.int32)), "torch.int32"),
    (dict(shape=(1, 2, 2, 8, 8, 8), dtype="f8"), "unknown dtype 'f8'"),
    (dict(shape=(1, 2, 2, 8, 8)), "six positive ints"),
    (dict(), "give tensors q, k and v"),
    (dict(shape=(1, 4, 1, 64, 64, 2**20)), "D=1048576"),
    (dict(shape=(1, 2, 2, 1, 64, 8), tiling=AttentionTiling(br=1, bc=8, split=8)), "split=8"),
])
def test_bad_inputs_name_the_fault(ahbm, kwargs, fault):
    with pytest.raises(ValueError, match=fault):
        attention(machine=ahbm, pes=range(8), **kwargs)


def test_bad_tiling_names_the_field():
    with pytest.raises(ValueError, match="chunk=0"):
        AttentionTiling(br=1, bc=8, chunk=0)


@pytest.mark.parametrize("lq, causal", [(1, False), (24, True)])
def test_on_several_chips_each_chip_takes_its_own_kv_heads(lq, causal):
    """On tiny_system (4 chips x 4 PEs) with 4 kv heads, every work item of head h runs on
    chip h, all chips get the same share, and the values still equal SDPA."""
    system = load_machine(str(DATA / "tiny_system.toml"))
    q, k, v = torch.randn(2, 8, lq, 16), torch.randn(2, 4, 40, 16), torch.randn(2, 4, 40, 16)
    run = attention(q, k, v, is_causal=causal, machine=system)
    _, works = _plan(system, run.shape, run.tiling, list(range(16)))
    assert all(system.chip_of(w.pe) == it.h for w in works for it in w.items)
    assert len({sum(1 for w in works if system.chip_of(w.pe) == c) for c in range(4)}) == 1
    assert torch.allclose(run.out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
                          atol=1e-5)


def test_decode_ring_that_overflows_the_tcm_takes_the_slots():
    """Qwen2.5-7B decode of 32 requests at 2049 positions on maia200: the ring of chunk buffers
    fits RING_BYTES but not the TCM beside the other buffers, so the kernel takes KV_SLOTS (it
    was refused and ran the unfused fallback); its time lies between 1025 and 4097 positions."""
    maia = load_machine("maia200")
    lat = [attention(shape=(32, 28, 4, 1, lk, 128), dtype="bf16", machine=maia).latency_ns for lk in (1025, 2049, 4097)]
    assert lat[0] < lat[1] < lat[2]
