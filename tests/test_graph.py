"""Graph mode (kbtorch.graph, graphed, torch.compile backend "kbtorch"): the same values as
eager and CPU, one launch, the replay cache, graph breaks reported."""
import pytest
import torch

import kbtorch
from kbtorch.tensor.graph import capture as graph_mod


def _fn(w, b):
    def fn(x):
        h = torch.nn.functional.silu(x @ w + b)
        return (h * 2 + x).sum(-1), h
    return fn


def test_capture_gives_eager_values_and_one_launch(small):
    w, b = torch.randn(32, 32), torch.randn(32)
    x = torch.randn(8, 32)
    want = _fn(w, b)(x)
    fn = _fn(w.to("ahbm"), b.to("ahbm"))
    xa = x.to("ahbm")
    with kbtorch.profile() as eager:
        fn(xa)
    with kbtorch.profile() as prof, kbtorch.graph() as g:
        got = fn(xa)
    for a, e in zip(got, want):
        torch.testing.assert_close(a.cpu(), e)
    assert [r.name for r in prof.records] == ["graph"]
    rec = prof.records[0]
    assert rec.parts and rec.latency_ns == pytest.approx(g.latency_ns)
    assert len(g.nodes) >= 5 and len(eager.records) == len(g.kernels)
    assert "aten::silu" in g.report() and "g" in rec.kernel


def test_the_timing_caches_hold_the_machine_not_its_id(small):
    """A machine that died could leave its id to another one, which would then be served the
    first one's timing (a sweep's machines come and go): the keys hold the machine itself."""
    xa = torch.randn(8, 32).to("ahbm")
    with kbtorch.graph():
        torch.nn.functional.silu(xa) * 2
    machine = kbtorch.current_machine()
    for cache in (graph_mod._CACHE, graph_mod._LIKE):
        assert any(isinstance(key[0], type(machine)) and key[0] == machine for key in cache)
        assert not any(isinstance(key[0], int) for key in cache)


def test_each_node_names_the_users_source_line(small):
    import inspect
    xa = torch.randn(8, 32).to("ahbm")
    with kbtorch.graph() as g:
        line = inspect.currentframe().f_lineno + 1
        torch.nn.functional.silu(xa)
    assert [n.site for n in g.nodes] == [f"test_graph.py:{line}"]


def test_replay_reads_the_inputs_anew_and_is_not_simulated_again(small):
    w, b = torch.randn(32, 32), torch.randn(32)
    fn = _fn(w.to("ahbm"), b.to("ahbm"))
    xa = torch.randn(8, 32).to("ahbm")
    with kbtorch.graph() as g:
        out, h = fn(xa)
    first = g.latency_ns
    new = torch.randn(8, 32)
    xa.copy_(new.to("ahbm"))
    with kbtorch.profile() as prof:
        g.replay()
    assert g.cached and prof.records[0].latency_ns == first
    want = _fn(w, b)(new)
    torch.testing.assert_close(out.cpu(), want[0])
    torch.testing.assert_close(h.cpu(), want[1])


def test_fusion_conserves_work(small):
    w, b = torch.randn(64, 64).to("ahbm"), torch.randn(64).to("ahbm")
    fn = _fn(w, b)
    xa = torch.randn(16, 64).to("ahbm")
    with kbtorch.graph(fuse=False) as plain:
        fn(xa)
    with kbtorch.graph() as fused:
        fn(xa)
    assert len(fused.plan.kernels) < len(plain.plan.kernels)
    assert sum(k.flops for k in fused.plan.kernels) == sum(k.flops for k in plain.plan.kernels)
    from kbtorch.ops.contract import memory_bytes
    assert memory_bytes(small, fused.schedule.result) <= memory_bytes(small, plain.schedule.result)
    assert fused.latency_ns < plain.latency_ns
    kinds = [k.kernel for k in fused.plan.kernels]
    assert "gemm+epilogue" in kinds


def test_graphed_module_caches_the_timing_of_repeated_shapes(small):
    lin = torch.nn.Linear(32, 32)
    x = torch.randn(4, 32)
    want = lin(x)
    lin.to("ahbm")
    kbtorch.graphed(lin)
    for _ in range(3):
        got = lin(x.to("ahbm"))
    torch.testing.assert_close(got.cpu(), want)
    assert lin.forward.graphs == {"calls": 3, "simulated": 1, "retimed": 0, "replayed": 0}   # with data: captured


def test_compile_backend_matches_cpu_and_reports_graph_breaks(small):
    from kbtorch.tensor.graph import compile as kc
    lin = torch.nn.Linear(32, 32)

    def fn(x):
        h = torch.nn.functional.silu(lin(x))
        print("graph break")
        return torch.nn.functional.rms_norm(h + x, (32,))
    x = torch.randn(4, 32)
    want = fn(x)
    lin.to("ahbm")
    torch._dynamo.reset()
    c = torch.compile(fn, backend="kbtorch")
    with torch.no_grad(), kbtorch.profile() as prof:
        got = c(x.to("ahbm"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert [r.name for r in prof.records] == ["compiled graph %d" % n["graph"] for n in kc.compiled()[-2:]]
    assert any("test_graph.py" in b and "print" in b for b in kc.breaks())
    before = kc.compiled()
    with torch.no_grad():
        c(torch.randn(6, 32).to("ahbm"))          # a new shape: compiled again
    new = kc.compiled()[len(before):]
    assert new and all(c_["inputs"][-1] == (6, 32) for c_ in new)
    assert [c_["recompiles"] for c_ in new] == [c_["graph"] for c_ in before[-len(new):]]
    assert all(c_["recompiles"] is None for c_ in before[-2:])


def test_two_graphs_cannot_nest(small):
    with kbtorch.graph():
        with pytest.raises(RuntimeError, match="already being captured"):
            with kbtorch.graph():
                pass


@pytest.mark.parametrize("batch", [1, 4])
def test_hf_model_forward_and_generate_in_graph_mode(small, batch):
    pytest.importorskip("transformers")
    from kbtorch.models.hf import build
    model, ref = build("tiny-qwen2")
    ids = torch.randint(2, 128, (batch, 6), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    mask[1:, :1] = 0
    model.to("ahbm")
    gen = dict(max_new_tokens=3, do_sample=False)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        expect = ref.generate(ids, attention_mask=mask, **gen)
        eager = model(ids.to("ahbm"), attention_mask=mask.to("ahbm")).logits.cpu()
        with kbtorch.graph():
            got = model(ids.to("ahbm"), attention_mask=mask.to("ahbm")).logits
        kbtorch.graphed(model)
        tokens = model.generate(ids.to("ahbm"), attention_mask=mask.to("ahbm"), **gen).cpu()
    torch.testing.assert_close(got.cpu(), eager, rtol=0, atol=0)
    torch.testing.assert_close(got.cpu()[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-4)
    assert torch.equal(tokens, expect)
    assert model.forward.graphs["calls"] == 3


def test_a_periodic_graph_is_simulated_in_part_at_its_steady_state(small):
    ws = [torch.randn(32, 32).to("ahbm") for _ in range(2)]
    x = torch.randn(8, 32).to("ahbm")

    def layers(x):
        for _ in range(8):
            x = torch.nn.functional.silu(x @ ws[0]) @ ws[1] + x
        return x
    with kbtorch.graph(periodic=False) as exact:
        want = layers(x)
    with kbtorch.graph() as short:
        got = layers(x)
    assert torch.equal(got.cpu(), want.cpu())
    assert getattr(short.schedule.result, "extrapolated", None) is not None
    assert len(short.schedule.finish_ps) == len(exact.schedule.finish_ps)
    assert short.latency_ns == pytest.approx(exact.latency_ns, rel=0.02)
    # the skipped blocks carry their attribution: the chain adds up to the latency, shared as the full run's
    got, full = short.schedule.result, exact.schedule.result
    assert sum(got.breakdown().values()) == got.latency_ps
    for kind in set(got.breakdown()) | set(full.breakdown()):
        assert got.breakdown().get(kind, 0) / got.latency_ps == pytest.approx(
            full.breakdown().get(kind, 0) / full.latency_ps, abs=0.01)
    # and their counters: the work of every block, as the full run's
    for kind, link in full.stats["links"].items():
        assert got.stats["links"][kind]["flits"] == link["flits"], kind
    assert {r: e["commands"] for r, e in got.stats["engines"].items()} == {
        r: e["commands"] for r, e in full.stats["engines"].items()}
    assert {m: s["bursts"] for m, s in got.stats["memories"].items()} == {
        m: s["bursts"] for m, s in full.stats["memories"].items()}


def test_chrome_trace_puts_concurrent_kernels_on_their_own_lanes(small, tmp_path):
    import json
    a, b = torch.randn(8, 32).to("ahbm"), torch.randn(8, 32).to("ahbm")
    w = torch.randn(32, 32).to("ahbm")
    with kbtorch.profile() as prof, kbtorch.graph():
        (a @ w).sum(-1), torch.nn.functional.silu(b).mean(-1)      # two independent branches
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["args"]["name"].startswith("graph lane")}
    parts = [e for e in events if e.get("cat") not in ("usage", "command") and e["ph"] == "X" and "PEs" in
             e.get("args", {}).get("detail", "")]
    assert len(lanes) >= 2 and len(parts) == len(prof.records[0].parts)


def test_a_norm_fuses_into_the_next_gemms_prologue(small):
    g_, w1, w2 = torch.randn(64).to("ahbm"), torch.randn(64, 64).to("ahbm"), torch.randn(64, 64).to("ahbm")
    r = torch.randn(16, 64).to("ahbm")

    def fn(x):
        s = x + r
        h = torch.nn.functional.rms_norm(s, (64,), g_, 1e-6)
        return s, h @ w1, h @ w2
    x = torch.randn(16, 64)
    want = fn(x.to("ahbm"))
    with kbtorch.graph(fuse=False) as plain:
        fn(x.to("ahbm"))
    with kbtorch.graph() as fused:
        got = fn(x.to("ahbm"))
    for a, e in zip(got, want):
        torch.testing.assert_close(a.cpu(), e.cpu())
    kinds = [k.kernel for k in fused.plan.kernels]
    assert kinds.count("norm+gemm") == 2 and "aten::rms_norm" in fused.report()
    assert not any(graph_mod.fusion.NORMS[0] == fused.nodes[fused.kernels[k.members[-1]].node].name
                   and k.kernel.endswith("vector") for k in fused.plan.kernels)
    assert sum(k.flops for k in fused.plan.kernels) == sum(k.flops for k in plain.plan.kernels)
    from kbtorch.ops.contract import memory_bytes
    assert memory_bytes(small, fused.schedule.result) < memory_bytes(small, plain.schedule.result)
    xa = x.to("ahbm")
    with kbtorch.graph() as held:           # the normalized tensor held after capture: written, no prologue
        h = torch.nn.functional.rms_norm(xa + r, (64,), g_, 1e-6)
        y = h @ w1
    assert "norm+gemm" not in [k.kernel for k in held.plan.kernels] and h.shape == y.shape


def test_the_decomposed_rms_norm_chain_fuses_into_the_gemm_prologue(small):
    gamma, w = torch.randn(64).to("ahbm"), torch.randn(64, 64).to("ahbm")

    def fn(x):
        # Hugging Face's RMSNorm forward, op by op
        v = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        h = gamma * (x * torch.rsqrt(v + 1e-6)).to(x.dtype)
        return h @ w
    x = torch.randn(16, 64)
    with kbtorch.graph(fuse=False) as plain:
        fn(x.to("ahbm"))
    with kbtorch.graph() as fused:
        got = fn(x.to("ahbm"))
    torch.testing.assert_close(got.cpu(), fn(x.to("ahbm")).cpu())
    assert [k.kernel for k in fused.plan.kernels] == ["norm+gemm"]
    assert sum(k.flops for k in fused.plan.kernels) == sum(k.flops for k in plain.plan.kernels)
    from kbtorch.ops.contract import memory_bytes
    assert memory_bytes(small, fused.schedule.result) < memory_bytes(small, plain.schedule.result)


def test_the_decode_layers_norms_fuse_into_their_projections(small):
    """Inference mode: ``linear`` reaches the device whole; the q/k/v and gate/up
    projections take the layer's norms in their prologues; work is conserved."""
    from kbtorch.models.qwen2 import TINY, KVCache, Model, tensor_parallel
    from kbtorch.ops.contract import memory_bytes
    with kbtorch.timing_only():
        with torch.device("meta"):
            model = Model(TINY, layers=1).to(torch.bfloat16)
        model.to("ahbm")
        tensor_parallel(model)
    graphs = {}
    for fuse in (False, True):
        with kbtorch.timing_only(), torch.inference_mode():
            shape = (1, TINY.kv_heads, 9, TINY.head_dim)
            cache = KVCache(torch.empty(shape, dtype=torch.bfloat16, device="ahbm"),
                            torch.empty(shape, dtype=torch.bfloat16, device="ahbm"), 8)
            with kbtorch.graph(fuse=fuse) as graphs[fuse]:
                model(torch.zeros(1, 1, dtype=torch.long, device="ahbm"), torch.tensor([8]), [cache])
    fused, plain = graphs[True], graphs[False]
    assert sum(k.kernel.startswith("norm+gemm") for k in fused.plan.kernels) == 5
    assert sum(k.flops for k in fused.plan.kernels) == sum(k.flops for k in plain.plan.kernels)
    assert memory_bytes(small, fused.schedule.result) <= memory_bytes(small, plain.schedule.result)
def _count_simulations(monkeypatch) -> list:
    from kbtorch.tensor.graph import join as scheduler
    calls, real = [], scheduler.simulate
    monkeypatch.setattr(scheduler, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_a_replay_with_the_same_shapes_is_not_simulated_again(small, monkeypatch):
    calls = _count_simulations(monkeypatch)
    w = torch.randn(32, 32).to("ahbm")
    x = torch.randn(8, 32).to("ahbm")
    with kbtorch.graph() as g:
        torch.nn.functional.silu(x @ w)
    assert len(calls) == 1 and not g.cached
    for _ in range(3):
        g.replay()
    with kbtorch.graph() as again:                  # captured anew, the same shapes
        torch.nn.functional.silu(x @ w)
    assert len(calls) == 1 and g.cached and again.cached and again.latency_ns == g.latency_ns


def _decode(model, ids, steps: int) -> tuple:
    """Greedy decode with a DynamicCache, every forward a graph: (graph latencies, counts,
    tokens, the graphs' runs)."""
    from transformers import DynamicCache
    kbtorch.graphed(model)
    cache, lat, tokens, how = DynamicCache(), [], [], []
    with torch.no_grad():
        out = model(ids, past_key_values=cache, use_cache=True)
        for _ in range(steps):
            tok = out.logits[:, -1:].argmax(-1)
            tokens.append(tok.cpu())
            out = model(tok, past_key_values=out.past_key_values, use_cache=True)
            lat.append(model.forward.last.latency_ns)
            how.append(model.forward.last.schedule.result)
    return lat, dict(model.forward.graphs), torch.cat(tokens, -1), how


def test_dynamic_cache_steps_are_retimed_within_the_tolerance(small, monkeypatch):
    pytest.importorskip("transformers")
    from kbtorch.models.hf import build
    ids = torch.randint(2, 128, (1, 12), generator=torch.Generator().manual_seed(3)).to("ahbm")
    runs = {}
    for tol in (-1.0, graph_mod.RETIME_TOLERANCE):          # -1: every step simulated
        monkeypatch.setattr(graph_mod, "RETIME_TOLERANCE", tol)
        kbtorch.reset("kbtorch.tensor.graph.capture")
        model, _ = build("tiny-qwen2")
        runs[tol] = _decode(model.to("ahbm"), ids, 4)
    (full, fcount, ftok, fhow), (fast, count, tok, how) = runs[-1.0], runs[graph_mod.RETIME_TOLERANCE]
    assert all(r.obtained.method in ("simulated", "periodic") for r in fhow)    # each step's record says how
    assert all(sum(r.breakdown().values()) == r.latency_ps for r in fhow + how)   # re-timed: the chain too
    retimed = [r.obtained for r in how if r.obtained.method == "retimed"]
    assert retimed and all(0 <= o.error_bound <= 2 * graph_mod.RETIME_TOLERANCE and o.events_simulated == 0
                       and o.events_skipped > 0 for o in retimed)
    assert torch.equal(tok, ftok)                                   # numerics do not depend on timing
    assert fcount["retimed"] == 0 and fcount["simulated"] == 5      # prefill + 4 steps, each a new KV length
    assert count["retimed"] >= 2 and count["simulated"] + count["retimed"] == 5
    for f, s in zip(full, fast):
        assert s == pytest.approx(f, rel=graph_mod.RETIME_TOLERANCE)
    assert fast[-1] > fast[0]                                       # the longer KV cache is seen


def _moved(programs) -> int:
    """Bytes a kernel's composites read and write (every tile of every move)."""
    from kbtorch.sim.commands import Composite
    return sum(c.tiles * sum(m.nbytes for m in c.reads + c.writes)
               for cmds in programs.values() for c in cmds if isinstance(c, Composite))


def test_a_fused_chain_of_mixed_widths_moves_no_more_than_its_passes(small):
    """A scalar int64 position (8-byte elements) and the KV-cache copy it indexes (bf16)
    fuse into one pass, which moves what the two passes moved, not every input at the
    widest width and longest length."""
    cache = torch.zeros(4, 8, 256, 64, dtype=torch.bfloat16).to("ahbm")
    new = torch.randn(4, 8, 1, 64, dtype=torch.bfloat16).to("ahbm")
    pos = torch.tensor([6]).to("ahbm")
    with kbtorch.graph() as g:
        cache.index_copy_(2, pos + 1, new)
    assert [k.kernel for k in g.plan.kernels] == ["fused vector"]
    assert _moved(g.plan.kernels[0].programs) <= sum(_moved(k.programs) for k in g.kernels)
    torch.testing.assert_close(cache.cpu()[:, :, 7:8], new.cpu())


def test_the_capture_frees_each_buffer_at_its_last_use(small):
    """The capture's tables are keyed by ``uid`` (a number of each buffer's own, never
    reused), so it holds no buffer: a temporary dies at its last use, and the peak modelled
    HBM of a graph is eager's, in capture and in replay."""
    layers = [torch.nn.Linear(256, 256).to("ahbm") for _ in range(8)]

    def chain(x):
        for lin in layers:
            x = torch.relu(lin(x))
        return x
    x = torch.randn(512, 256).to("ahbm")
    peaks = {}
    for mode in ("eager", "capture", "replay"):
        torch.ahbm.reset_peak_memory_stats()
        base = torch.ahbm.memory_allocated()
        with torch.no_grad():
            if mode == "eager":
                chain(x)
            elif mode == "capture":
                with kbtorch.graph() as g:
                    chain(x)
            else:
                g.replay()
        peaks[mode] = torch.ahbm.max_memory_allocated() - base
    one = 512 * 256 * 4 // len(kbtorch.current_machine().pes)
    assert peaks["eager"] < 16 * one            # not the 16 intermediates (8 linears, 8 relus) at once
    assert peaks["capture"] == peaks["replay"] == peaks["eager"], peaks
    assert max(kbtorch.hbm_peaks().values()) == torch.ahbm.max_memory_allocated()


def test_a_graph_is_planned_and_simulated_with_the_collector_paused(small, monkeypatch):
    import gc
    seen = []
    plan = graph_mod.fusion.plan

    def spy(g):
        seen.append(gc.isenabled())
        return plan(g)
    monkeypatch.setattr(graph_mod.fusion, "plan", spy)
    w, b = torch.randn(32, 32).to("ahbm"), torch.randn(32).to("ahbm")
    with kbtorch.graph():
        _fn(w, b)(torch.randn(8, 32).to("ahbm"))
    assert seen == [False] and gc.isenabled()


def test_graph_takes_a_machine_name_and_refuses_another_machines_ops(small):
    """``kbtorch.graph(machine=...)`` takes a name or path like the rest of the API; ops that
    ran on another machine are refused, naming both (issue 45)."""
    x = torch.ones(4, 8, device="ahbm")
    with kbtorch.graph(machine=str(small.path)) as g:
        x * 2
    assert g.machine is small and g.latency_ns > 0
    with pytest.raises(RuntimeError, match=r"machine='maia200'.*ran on"):
        with kbtorch.graph(machine="maia200"):
            x * 2


def test_a_vector_pass_never_joins_a_group_another_kernel_already_waits_for(small):
    """A group read outside it is closed: the pass that reads it and another kernel's result
    runs on its own, and every planned kernel comes after what it waits for (issue 45)."""
    a, w = torch.randn(8, 16).to("ahbm"), torch.randn(16, 16).to("ahbm")
    with kbtorch.graph() as g:
        t = torch.cos(a) * 2                 # a shared table
        u = t + 1                            # read outside the table's group
        v = (a @ w) * t                      # a GEMM's result times the table
        out = (u + v).sum()
    _plan_keeps_every_dependency(g)
    assert torch.allclose(out.cpu(), ((torch.cos(a.cpu()) * 2 + 1) + (a.cpu() @ w.cpu()) * torch.cos(a.cpu()) * 2).sum(), rtol=1e-4)


def _plan_keeps_every_dependency(g):
    """Every planned kernel waits for the planned kernels holding what its members wait for
    (a norm prologue's members are recomputed by each GEMM reading it: not waited for)."""
    def held(k):
        gemm = next((j for j, m in enumerate(k.members) if g.kernels[m].timed.kernel == "gemm"), 0)
        return k.members[gemm:] if k.kernel.startswith("norm+") else k.members
    at = {m: i for i, k in enumerate(g.plan.kernels) for m in held(k)}
    for i, k in enumerate(g.plan.kernels):
        want = {at[d] for m in k.members for d in g.kernels[m].deps if d in at and at[d] != i}
        assert want <= set(k.deps) and all(d < i for d in k.deps), (i, k.kernel, want, k.deps)


def test_the_tiny_llamas_batch_1_plan_keeps_the_rotary_tables_dependencies():
    """On AHBM at batch 1 the k path's mul joined the rotary tables' group after the q path
    had read it: the q path then did not wait for the tables (issue 45)."""
    pytest.importorskip("transformers")
    from kbtorch.models.hf import build
    model, _ = build("tiny-llama")
    model = model.to("ahbm")
    with torch.no_grad(), kbtorch.graph() as g:
        model(torch.randint(0, 100, (1, 6)).to("ahbm"))
    _plan_keeps_every_dependency(g)


def test_every_record_says_how_it_was_obtained(small):
    """Eager ops and a graph's launch carry their run's record (``Profile.obtained``), of the
    fidelity in force; an op repeated from a memoized run counts as one run."""
    w, b = torch.randn(32, 32).to("ahbm"), torch.randn(32).to("ahbm")
    xa = torch.randn(8, 32).to("ahbm")
    fn = _fn(w, b)
    for fid in ("exact", "auto"):
        with kbtorch.profile(fidelity=fid) as eager:
            fn(xa)
            fn(xa)
        got = eager.obtained()
        n = len(eager.records)
        assert got["ops_by_method"] == {"simulated": n} and got["ops_by_fidelity"] == {fid: n}
        assert 0 < got["runs"] <= n // 2 and got["events_simulated"] > 0 and got["events_skipped"] == 0
        with kbtorch.profile(fidelity=fid) as prof, kbtorch.graph():
            fn(xa)
        assert prof.obtained()["ops_by_fidelity"] == {fid: 1} and prof.records[0].obtained.method == "simulated"


def test_a_periodic_graph_records_the_blocks_it_skipped(small):
    ws = [torch.randn(32, 32).to("ahbm") for _ in range(8)]
    xa = torch.randn(8, 32).to("ahbm")

    def layers(x):
        for w in ws:
            x = torch.nn.functional.silu(x @ w)
        return x
    with kbtorch.profile(fidelity="exact") as prof, kbtorch.graph():
        layers(xa)
    o = prof.records[0].obtained
    assert (o.fidelity, o.method) == ("exact", "periodic") and o.repeats_skipped > 0
    assert o.skipped_ps > 0 and o.events_skipped > 0 and 0 <= o.error_bound < 0.005
