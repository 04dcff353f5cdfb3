"""``torch.compile(model, backend="kbtorch")`` on unmodified Hugging Face models (tiny configs,
seeded random weights) against CPU: logits and greedy tokens equal, the latency in
``kbtorch.profile()``, dynamic shapes, graph breaks named by the user's line only, and a
model left on CPU refused by name."""
import pytest
import torch

import kbtorch
from kbtorch.tensor.graph import compile as kc

transformers = pytest.importorskip("transformers")

from kbtorch.models.hf import build  # noqa: E402

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
#: Families beyond the presets, as their config classes build them (gemma2: eager attention, its default).
FAMILIES = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=128),
    "gemma2": lambda: transformers.AutoConfig.for_model("gemma2", **SMALL, head_dim=16,
                                                        attn_implementation="eager"),
    "phi3": lambda: transformers.AutoConfig.for_model("phi3", **SMALL),
    "qwen3": lambda: transformers.AutoConfig.for_model("qwen3", **SMALL, head_dim=16),
}
PRESETS = ("tiny-qwen2", "tiny-llama", "tiny-mistral", "tiny-mixtral", "tiny-qwen3-moe", "tiny-olmoe")


def _models(name):
    if name in FAMILIES:
        torch.manual_seed(0)
        ref = transformers.AutoModelForCausalLM.from_config(FAMILIES[name]()).eval()
        model = transformers.AutoModelForCausalLM.from_config(ref.config).eval()
        model.load_state_dict(ref.state_dict())
        return model, ref
    return build(name)


@pytest.mark.parametrize("name", [*FAMILIES, *PRESETS])
def test_compiled_model_matches_cpu_and_is_timed(name):
    model, ref = _models(name)
    ids = torch.randint(2, 128, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = ref(ids).logits
        model.to("ahbm")
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="kbtorch")
        with kbtorch.profile() as prof:
            got = compiled(ids.to("ahbm")).logits
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    # NOTE: code dynamo cannot trace (the eager experts loop's data-dependent routing) runs eagerly between graphs.
    graphs = [r for r in prof.records if r.name.startswith("compiled graph ")]
    assert graphs and all(r.latency_ns > 0 for r in graphs)
    assert kc.breaks() == [] or all("transformers" not in b and "kbtorch" not in b for b in kc.breaks())


def test_compiled_generate_matches_cpu():
    model, ref = build("tiny-qwen2")
    ids = torch.randint(2, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    gen = dict(max_new_tokens=4, do_sample=False)
    want = ref.generate(ids, **gen)
    model.to("ahbm")
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="kbtorch")
    with kbtorch.profile() as prof:
        got = model.generate(ids.to("ahbm"), **gen)
    assert torch.equal(got.cpu(), want)
    assert sum(r.name.startswith("compiled graph ") for r in prof.records) >= 4    # prefill and each decode step


def test_dynamic_shapes_one_graph_timed_per_shape():
    model, ref = build("tiny-llama")
    model.to("ahbm")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kbtorch", dynamic=True)
    before = len(kc.compiled())
    latency = {}
    for batch, length in ((2, 5), (3, 9), (4, 12)):   # NOTE: not 1: dynamo specialises sizes 0 and 1
        ids = torch.randint(2, 128, (batch, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad(), kbtorch.profile() as prof:
            got = compiled(ids.to("ahbm")).logits
            torch.testing.assert_close(got.cpu(), ref(ids).logits, rtol=1e-4, atol=1e-4)
        latency[batch, length] = prof.total_ns
    assert len(kc.compiled()) - before == 1          # one graph serves every shape
    assert len(set(latency.values())) == 3           # each concrete shape simulated: three latencies


def test_model_left_on_cpu_is_refused_by_parameter_name():
    model, _ = build("tiny-qwen2")
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"parameter model\.embed_tokens\.weight \(128, 64\) is on 'cpu', not on "
                                        r"'ahbm'"):
        torch.compile(model, backend="kbtorch")(torch.ones(1, 4, dtype=torch.long))


def test_graph_break_names_the_user_line_only(small):
    lin = torch.nn.Linear(16, 8).to("ahbm")

    def fn(x):
        y = lin(x)
        scale = y.sum().item()
        return y * scale
    torch._dynamo.reset()
    kbtorch.reset("kbtorch.tensor.graph.compile._BREAKS")
    x = torch.ones(2, 16).to("ahbm")
    with kbtorch.profile() as prof:
        got = torch.compile(fn, backend="kbtorch")(x)
    torch.testing.assert_close(got.cpu(), fn(x).cpu())
    assert len(kc.breaks()) == 1 and kc.breaks()[0].startswith("test_compile.py:")
    assert [r.name for r in prof.records][0].startswith("compiled graph ")
    assert all(c["ops"] > 0 for c in kc.compiled()[-2:])      # no empty graph of kbtorch's own code


def test_out_variant_writes_into_a_view(small):
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    out = torch.zeros(6, 3)
    torch.mm(a, b, out=out[1:5])
    da, db, dout = a.to("ahbm"), b.to("ahbm"), torch.zeros(6, 3).to("ahbm")
    with kbtorch.profile() as prof:
        torch.mm(da, db, out=dout[1:5])
    torch.testing.assert_close(dout.cpu(), out)
    assert prof.total_ns > 0
    with pytest.raises(RuntimeError, match=r"does not fit out= \(3, 3\)"):
        torch.mm(da, db, out=dout[:3])


def test_factory_ops_on_the_device_inside_compile(small):
    """``torch.ones``/``arange`` on ahbm and a factory from an ahbm tensor (``new_zeros``) run
    inside a compiled graph with eager's values (issue 45)."""
    def fn(x):
        return x + torch.ones(4, 8, device="ahbm") + torch.arange(8, device="ahbm", dtype=torch.float32) \
            + x.new_zeros(4, 8) + x.new_ones(4, 8)
    x = torch.randn(4, 8).to("ahbm")
    got = torch.compile(fn, backend="kbtorch")(x)
    assert got.device.type == "ahbm" and torch.equal(got.cpu(), fn(x).cpu())


def test_a_new_function_with_the_same_ops_is_a_new_graph_not_a_recompile(small):
    """The report names a recompile only of the same frame: a second function with the same
    ops and shapes is its own graph (issue 45)."""
    def f(x):
        return x * 3 - 1

    def g(x):
        return x * 3 - 1
    start = len(kc.compiled())
    x = torch.randn(4, 8).to("ahbm")
    torch.compile(f, backend="kbtorch")(x)
    torch.compile(g, backend="kbtorch")(x)
    got = kc.compiled()[start:]
    assert [c["recompiles"] for c in got] == [None, None]
