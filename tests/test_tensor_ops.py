"""Ops on ahbm tensors against torch on CPU; the stream clock; the profiler."""
import json

import pytest
import torch
import torch.nn.functional as F

import kbtorch
from kbtorch.tensor import AhbmTensor, Replicate, Shard
from kbtorch.tensor.stream import clock_ns

TOL = {torch.float16: 2e-2, torch.bfloat16: 1e-1, torch.float32: 1e-4}


def close(ahbm, ref):
    expect = (Shard(next(d for d, n in enumerate(ref.shape) if n >= 256)),) if max(ref.shape, default=0) >= 256 \
        else (Replicate(),)
    assert isinstance(ahbm, AhbmTensor) and ahbm.placements == expect
    got = ahbm.cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype
    tol = TOL[ref.dtype]
    assert torch.allclose(got.float(), ref.float(), atol=tol * max(1.0, ref.float().abs().max().item()), rtol=tol)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mm_addmm_bmm_linear(gen, dtype):
    a = torch.randn(33, 70, generator=gen).to(dtype)
    b = torch.randn(70, 19, generator=gen).to(dtype)
    bias = torch.randn(19, generator=gen).to(dtype)
    A, B, C = a.to("ahbm"), b.to("ahbm"), bias.to("ahbm")
    close(A @ B, (a.float() @ b.float()).to(dtype))
    close(torch.addmm(C, A, B), (a.float() @ b.float() + bias.float()).to(dtype))
    close(F.linear(A, B.t(), C), F.linear(a.float(), b.t().float(), bias.float()).to(dtype))
    x, y = torch.randn(3, 8, 5, generator=gen).to(dtype), torch.randn(3, 5, 4, generator=gen).to(dtype)
    close(torch.bmm(x.to("ahbm"), y.to("ahbm")), torch.bmm(x.float(), y.float()).to(dtype))


@pytest.mark.parametrize("op", [
    lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y, lambda x, y: x / (y.abs() + 1),
    lambda x, y: F.silu(x), lambda x, y: F.gelu(x), lambda x, y: torch.exp(x), lambda x, y: x * 2.0 + 1.0,
    lambda x, y: torch.maximum(x, y), lambda x, y: x + y[0],
])
def test_elementwise(gen, op):
    x, y = torch.randn(6, 10, generator=gen), torch.randn(6, 10, generator=gen)
    close(op(x.to("ahbm"), y.to("ahbm")), op(x, y))


@pytest.mark.parametrize("op", [
    lambda x: torch.softmax(x, dim=-1), lambda x: F.log_softmax(x, dim=0), lambda x: F.rms_norm(x, (x.shape[-1],)),
    lambda x: x.mean(-1), lambda x: x.sum(), lambda x: x.pow(2), lambda x: torch.rsqrt(x.abs() + 1),
])
@pytest.mark.parametrize("inference", [False, True])
def test_softmax_norms_reductions(gen, op, inference):
    x = torch.randn(5, 24, generator=gen)
    with torch.inference_mode(inference):
        close(op(x.to("ahbm")), op(x))


def test_safe_softmax_and_a_masked_transformer_layer_match_cpu(gen):
    """``aten._safe_softmax`` (softmax with fully masked rows as zeros; torch's attention
    takes it under a boolean mask) runs as softmax does: nn.TransformerEncoderLayer was refused."""
    x = torch.randn(3, 8, generator=gen)
    x[1] = float("-inf")
    close(torch.ops.aten._safe_softmax(x.to("ahbm"), -1), torch.ops.aten._safe_softmax(x, -1))
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, dropout=0.0).eval()
    src, mask = torch.randn(2, 5, 16, generator=gen), torch.zeros(5, 5, dtype=torch.bool)
    mask[:, 3:] = True
    with torch.no_grad():
        want = layer(src, src_mask=mask)
        close(layer.to("ahbm")(src.to("ahbm"), src_mask=mask.to("ahbm")), want)


def test_in_place_add_updates_the_tensor(gen):
    x = torch.randn(4, 4, generator=gen)
    y = x.to("ahbm")
    same = y.add_(1.5)
    assert same is y
    close(y, x + 1.5)


def test_mlp_module_matches_cpu(gen):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 8))
    x = torch.randn(5, 16, generator=gen)
    with torch.no_grad():
        ref = mlp(x)
        mlp.to("ahbm")
        close(mlp(x.to("ahbm")), ref)


def test_ops_advance_the_stream_clock_and_are_never_free(gen):
    x = torch.randn(64, 64, generator=gen, dtype=torch.float16).to("ahbm")
    t0 = clock_ns()
    with kbtorch.profile() as prof:
        y = x @ x
        z = y + x
    assert clock_ns() == pytest.approx(t0 + prof.total_ns)
    assert [r.name for r in prof.records] == ["aten::mm", "aten::add"]
    assert all(r.latency_ns > 0 and r.bottleneck for r in prof.records)
    assert prof.records[0].flops == 2 * 64 ** 3 and prof.records[1].start_ns == pytest.approx(
        prof.records[0].start_ns + prof.records[0].latency_ns)
    assert isinstance(z, AhbmTensor)


def test_profile_table_and_chrome_trace(tmp_path, gen):
    lin = torch.nn.Linear(32, 16).to("ahbm")
    x = torch.randn(8, 32, generator=gen).to("ahbm")
    with torch.no_grad(), kbtorch.profile() as prof:
        F.silu(lin(x))
    table = prof.key_averages().table(sort_by="latency_ns", row_limit=5)
    assert "aten::addmm" in table and "aten::silu" in table and "bottleneck" in table
    with pytest.raises(ValueError, match="sort_by"):
        prof.key_averages().table(sort_by="nope")
    # NOTE: iterable as torch.profiler's key averages, with its attribute and sort-key names.
    avgs = {e.key: e for e in prof.key_averages()}
    assert {"aten::addmm", "aten::silu"} <= set(avgs) and all(e.count == 1 for e in avgs.values())
    assert avgs["aten::addmm"].device_time_total == pytest.approx(prof.records[0].latency_ns / 1000)
    by_time = prof.key_averages().table(sort_by="self_device_time_total", row_limit=1)
    assert by_time.count("aten::") == 1 and max(avgs.values(), key=lambda e: e.latency_ns).key in by_time
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] not in ("usage", "command")]
    usage = [e for e in events if e["ph"] == "X" and e["cat"] == "usage"]
    commands = [e for e in events if e["ph"] == "X" and e["cat"] == "command"]
    assert len(ops) == len(prof.records) and len({e["tid"] for e in ops}) >= 2
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"engine gemm", "engine math", "links noc", "first PE: gemm", "first PE: math"} <= tracks and usage
    assert all(0 < e["args"]["busy"] <= 1 for e in usage)
    for e in commands:                                  # each command inside its op's span
        op = next(o for o in ops if o["name"] == e["args"]["op"] and o["ts"] <= e["ts"])
        assert e["dur"] > 0 and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + 1e-9


def test_the_profile_keeps_host_code_apart_from_the_models_ops(gen):
    """Ops a module's call ran (eager, graphed or compiled) name the outermost module; the
    host code's ops around it (here a sum, in generate() its bookkeeping) are kept apart."""
    def block():
        return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).to("ahbm")
    mlp, x = block(), torch.randn(4, 32, generator=gen).to("ahbm")
    graphed, compiled = kbtorch.graphed(block()), torch.compile(block(), backend="kbtorch")
    graphed(x), compiled(x)
    with torch.no_grad(), kbtorch.profile() as prof:
        (mlp(x) * 2).sum()
        graphed(x), compiled(x)
    names = [r.name for r in prof.records]
    assert names[:6] == ["aten::addmm", "aten::addmm (bias)", "aten::relu", "aten::mul", "aten::sum", "Sequential"]
    assert len(names) == 7 and names[6].startswith("compiled graph")
    assert [r.module for r in prof.records] == ["Sequential"] * 3 + [""] * 2 + ["Sequential"] * 2
    host = sum(r.latency_ns for r in prof.records[3:5])
    assert prof.host_ns == pytest.approx(host) and prof.model_ns == pytest.approx(prof.total_ns - host)
    avgs = prof.key_averages()
    assert [(e.key, e.module) for e in avgs if not e.module] == [("aten::mul", ""), ("aten::sum", "")]
    model, rest = prof.key_averages().table().split("host code outside any module")
    assert model.startswith("in Sequential calls:") and "aten::relu" in model and "aten::sum" not in model
    assert "aten::sum" in rest and "aten::relu" not in rest
    with kbtorch.profile() as alone:                     # no module at all: one table, as before
        x + x
    assert "host code" not in alone.key_averages().table() and alone.host_ns == alone.total_ns


def test_generates_bookkeeping_is_host_code():
    pytest.importorskip("transformers")
    from kbtorch.models.hf import build
    model = build("tiny-llama")[0].to("ahbm")
    ids = torch.tensor([[1, 2, 3, 4]]).to("ahbm")
    with torch.no_grad(), kbtorch.profile() as prof:
        model.generate(ids, max_new_tokens=2, do_sample=False)
    where = {r.name: r.module for r in prof.records}
    assert where["aten::isin"] == "" and where["aten::mm"] == "LlamaForCausalLM"
    assert 0 < prof.host_ns < prof.model_ns


def test_errors_like_torch(gen):
    a = torch.randn(3, 4, generator=gen).to("ahbm")
    with pytest.raises(RuntimeError, match="same device"):
        a @ torch.randn(4, 2)
    with pytest.raises(RuntimeError):
        a @ torch.randn(5, 2).to("ahbm")
    with pytest.raises(NotImplementedError, match=r"aten\._linalg_svd"):
        torch.linalg.svd(a)
    with pytest.raises(NotImplementedError, match="dtype torch.complex64"):
        a.to(torch.complex64) @ a.to(torch.complex64).t()


def _example(name):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name, argv", [
    ("matmul_latency", ["--m", "96", "--n", "64", "--k", "80", "--json"]),
    ("mlp_block", ["--tokens", "4", "--hidden", "64", "--intermediate", "128", "--json"]),
])
def test_examples_run_and_match_cpu(capsys, name, argv):
    assert _example(name).main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["allclose"] and out["latency_ns"] > 0 and all(op["latency_ns"] > 0 for op in out["ops"])


@pytest.mark.parametrize("causal, q_heads, kv_heads, length, kind", [
    (True, 4, 4, 8, "prefill"), (False, 4, 2, 20, "prefill"), (True, 7, 1, 5, "prefill"), (False, 4, 1, 7, "decode"),
    (False, 7, 1, 1, "decode")])
def test_sdpa_runs_the_fused_kernel_and_matches_cpu(gen, causal, q_heads, kv_heads, length, kind):
    q = torch.randn(2, q_heads, length, 16, generator=gen)
    k, v = torch.randn(2, kv_heads, 11, 16, generator=gen), torch.randn(2, kv_heads, 11, 16, generator=gen)
    with kbtorch.profile() as prof:
        out = F.scaled_dot_product_attention(q.to("ahbm"), k.to("ahbm"), v.to("ahbm"), is_causal=causal,
                                             enable_gqa=True)
    close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True))
    [rec] = prof.records
    assert rec.name == "aten::scaled_dot_product_attention" and rec.kernel == f"attention {kind}"
    assert rec.latency_ns > 0 and rec.flops > 0 and rec.bytes > 0


def test_sdpa_with_a_mask_runs_the_kernel_and_a_mask_pass(gen):
    q, k, v = (torch.randn(1, 2, 6, 16, generator=gen) for _ in range(3))
    mask = torch.rand(6, 6, generator=gen) > 0.3
    mask.fill_diagonal_(True)
    with kbtorch.profile() as prof:
        out = F.scaled_dot_product_attention(q.to("ahbm"), k.to("ahbm"), v.to("ahbm"), attn_mask=mask.to("ahbm"))
    close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    kernel, masked = prof.records
    assert kernel.name == "aten::scaled_dot_product_attention" and kernel.kernel.startswith("attention")
    assert masked.name == "aten::scaled_dot_product_attention (mask)" and masked.kernel == "elementwise select"
    assert masked.latency_ns > 0 and masked.bytes > 0


def test_sdpa_with_dropout_runs_the_fallback_and_says_so(gen):
    q, k, v = (torch.randn(1, 2, 6, 16, generator=gen) for _ in range(3))
    with kbtorch.profile() as prof:
        F.scaled_dot_product_attention(q.to("ahbm"), k.to("ahbm"), v.to("ahbm"), dropout_p=0.5)
    assert {r.name for r in prof.records} == {"sdpa fallback: q @ k^T", "sdpa fallback: softmax", "sdpa fallback: p @ v"}
    assert all("explicitly slow" in r.detail for r in prof.records)


def test_timing_only_holds_no_data_and_still_times(gen):
    with kbtorch.timing_only():
        lin = torch.nn.Linear(256, 512, bias=False).half().to("ahbm")
        x = torch.empty(4, 256, dtype=torch.float16, device="ahbm")
        with kbtorch.profile() as prof:
            y = F.silu(lin(x))
    assert lin.weight._value.is_meta and y._value.is_meta and y.shape == (4, 512)
    assert [r.name for r in prof.records] == ["aten::mm", "aten::silu"] and prof.total_ns > 0
    with pytest.raises(RuntimeError, match="timing-only"):
        y.cpu()
    assert not torch.ones(2, device="ahbm")._value.is_meta


def _rotate_half(t):
    a, b = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
    return torch.cat((-b, a), dim=-1)


def test_cat_embedding_rotary(gen):
    x = torch.randn(4, 6, generator=gen)
    X = x.to("ahbm")
    close(torch.cat([X, X * 2], dim=0), torch.cat([x, x * 2], dim=0))
    cos, sin = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    close(X * cos.to("ahbm") + _rotate_half(X) * sin.to("ahbm"), x * cos + _rotate_half(x) * sin)
    emb = torch.nn.Embedding(10, 8)
    idx = torch.tensor([1, 3, 3, 7])
    with torch.no_grad():
        ref = emb(idx)
        emb.to("ahbm")
        close(emb(idx.to("ahbm")), ref)


class Attention(torch.nn.Module):
    """A small GQA attention block with rotary embedding, in plain torch."""

    def __init__(self, hidden=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kv, self.d = heads, kv_heads, hidden // heads
        self.q = torch.nn.Linear(hidden, heads * self.d)
        self.k = torch.nn.Linear(hidden, kv_heads * self.d)
        self.v = torch.nn.Linear(hidden, kv_heads * self.d)
        self.o = torch.nn.Linear(heads * self.d, hidden, bias=False)

    def forward(self, x, cos, sin):
        s = x.shape[0]
        q = self.q(x).view(s, self.h, self.d).transpose(0, 1)
        k = self.k(x).view(s, self.kv, self.d).transpose(0, 1)
        v = self.v(x).view(s, self.kv, self.d).transpose(0, 1)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return x + self.o(a.transpose(0, 1).reshape(s, self.h * self.d))


def test_attention_block_module_matches_cpu(gen):
    torch.manual_seed(0)
    block = Attention()
    x = torch.randn(5, 32, generator=gen)
    cos, sin = torch.randn(1, 5, 8, generator=gen), torch.randn(1, 5, 8, generator=gen)
    with torch.no_grad():
        ref = block(x, cos, sin)
        block.to("ahbm")
        with kbtorch.profile() as prof:
            got = block(x.to("ahbm"), cos.to("ahbm"), sin.to("ahbm"))
    close(got, ref)
    names = {r.name for r in prof.records}
    assert {"aten::addmm", "aten::cat", "aten::scaled_dot_product_attention", "aten::mm", "aten::clone"} <= names
