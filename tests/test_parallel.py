"""Parallel plans (parallelize_module, the styles, tp_plan) on a system of chips: placements,
values against CPU, the collectives across chips, and a tiny Llama tensor parallel over 2 chips."""
import pytest
import torch
from torch import nn

import kbtorch
from kbtorch import (ColwiseParallel, Partial, Replicate, ReplicateParallel, RowwiseParallel, Shard, init_device_mesh,
                     parallelize_module, tp_plan)
from kbtorch.topology import load_machine

from conftest import DATA


@pytest.fixture(scope="module")
def two_chips():
    """tiny_system with one tray: 2 chips x 4 PEs."""
    return load_machine(str(DATA / "tiny_system.toml"), overrides={"system.trays": 1})


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.up = nn.Linear(64, 256)
        self.down = nn.Linear(256, 64)

    def forward(self, x):
        return self.down(torch.relu(self.up(self.norm(x))))


def _twins() -> tuple:
    """(a CPU Mlp, an input, a copy of the Mlp with the same weights to place)."""
    torch.manual_seed(0)
    ref, x = Mlp(), torch.randn(8, 64)
    model = Mlp()
    model.load_state_dict(ref.state_dict())
    return ref, x, model


def test_colwise_then_rowwise_equals_cpu_and_reduces_across_chips(two_chips):
    ref, x, model = _twins()
    with kbtorch.use(two_chips):
        mesh = init_device_mesh()
        model.to("ahbm")
        parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel(), "norm": ReplicateParallel()})
        assert model.up.weight.placements == (Shard(0), Shard(0)) and model.up.bias.placements == (Shard(0), Shard(0))
        assert model.down.weight.placements == (Shard(1), Shard(1)) and model.down.bias.placements == (Replicate(),) * 2
        assert model.norm.weight.placements == (Replicate(),) * 2
        with torch.no_grad(), kbtorch.profile() as prof:
            y = model(x.to("ahbm"))
    assert torch.allclose(y.cpu(), ref(x), atol=1e-5)
    across = [r for r in prof.records if r.name.startswith("redistribute") and "'chip'" in r.detail]
    inside = [r for r in prof.records if r.name.startswith("redistribute") and "'pe'" in r.detail]
    assert across and inside and all(r.latency_ns > 0 for r in across)


def test_a_style_on_a_sub_mesh_replicates_across_the_other_dimension(two_chips):
    ref, x, model = _twins()
    with kbtorch.use(two_chips):
        mesh = init_device_mesh()
        model.to("ahbm")
        parallelize_module(model, mesh["pe"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        assert model.up.weight.placements == (Replicate(), Shard(0))
        with torch.no_grad(), kbtorch.profile() as prof:
            y = model(x.to("ahbm"))
    assert torch.allclose(y.cpu(), ref(x), atol=1e-5)
    assert not [r for r in prof.records if "'chip'" in r.detail]        # each chip computes the whole: no traffic


def test_bad_plans_are_refused_before_anything_moves(two_chips):
    model = Mlp()
    with kbtorch.use(two_chips):
        mesh = init_device_mesh()
        with pytest.raises(ValueError, match="'upp' names no submodule of Mlp"):
            parallelize_module(model, mesh, {"up": ColwiseParallel(), "upp": ColwiseParallel()})
        with pytest.raises(ValueError, match="has no apply"):
            parallelize_module(model, mesh, {"up": "colwise"})
        with pytest.raises(ValueError, match="expects nn.Linear or nn.Embedding, got LayerNorm"):
            parallelize_module(model, mesh, {"norm": ColwiseParallel()})
        assert model.up.weight.device.type == "cpu"
        with pytest.raises(KeyError, match="mesh dimension 'tp'"):
            tp_plan(model, mesh, "tp")
        with pytest.raises(ValueError, match="no layer named o_proj or down_proj"):
            tp_plan(model, mesh)


class Stage:
    """A style of another kind (the protocol: apply(module, mesh) -> module)."""

    def __init__(self):
        self.seen = []

    def apply(self, module, mesh):
        self.seen.append((type(module).__name__, mesh.shape))
        return module


def test_any_object_with_apply_is_a_style(two_chips):
    style = Stage()
    with kbtorch.use(two_chips):
        parallelize_module(Mlp(), init_device_mesh(), {"up": style, "down": style})
    assert style.seen == [("Linear", (2, 4)), ("Linear", (2, 4))]


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("transformers")
    from kbtorch.models.hf import build
    return build("tiny-llama")


def test_tp_plan_of_a_decoder(llama, two_chips):
    model, _ = llama
    with kbtorch.use(two_chips):
        plan = tp_plan(model, init_device_mesh(), "pe")
    assert isinstance(plan["model.layers.*.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["model.layers.*.mlp.down_proj"], RowwiseParallel)
    assert isinstance(plan["model.embed_tokens"], RowwiseParallel) and isinstance(plan["lm_head"], ColwiseParallel)
    assert isinstance(plan["model.norm"], ReplicateParallel) and plan["lm_head"].dims == ("pe",)


def test_tiny_llama_tensor_parallel_over_two_chips_equals_cpu(two_chips):
    """The default plan of a system (hf.place_plan): logits and greedy tokens equal CPU; o and
    down row-parallel across chips and column-parallel inside each (their partial sums
    reduced across chips only), the vocab-parallel embedding's inside each chip, then across."""
    pytest.importorskip("transformers")
    from kbtorch.models.hf import build, place_plan
    model, ref = build("tiny-llama")
    ids = torch.randint(2, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    with kbtorch.use(two_chips):
        plan, where = place_plan(model)
        assert "2 chips x 4 PEs" in plan and "TP 2" in plan and where is None
        assert model.model.layers[0].mlp.down_proj.weight.placements == (Shard(1), Shard(0))
        with torch.no_grad(), kbtorch.profile() as prof:
            logits = model(ids.to("ahbm")).logits
            out = model.generate(ids.to("ahbm"), max_new_tokens=3, do_sample=False)
        with pytest.raises(ValueError, match="--tp 4 x --dp 1: topology .tiny_system. has 2 chips"):
            place_plan(model, 4)
    with torch.no_grad():
        expect, tokens = ref(ids).logits, ref.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.allclose(logits.cpu(), expect, atol=1e-4) and torch.equal(out.cpu(), tokens)
    kinds = {(r.kernel.split()[0], r.detail.split("'")[1]) for r in prof.records if r.name.startswith("redistribute")}
    assert ("all_reduce", "chip") in kinds and ("reduce_scatter", "pe") in kinds
    assert all(isinstance(p, (Shard, Replicate, Partial)) for p in logits.placements)


def test_hf_generate_data_parallel_replicas_on_a_system(capsys):
    """--dp 2 on 4 tiny chips: TP over the 2 chips of replica 0 with half the batch; tokens
    equal CPU; tokens/s counts both replicas."""
    pytest.importorskip("transformers")
    import json
    import sys
    sys.path.insert(0, str(DATA.parents[1] / "examples"))
    import hf_generate
    args = ["--model", "tiny-llama", "--topology", str(DATA / "tiny_system.toml"), "--check", "--prompt-len", "6",
            "--new-tokens", "2", "--batch", "4", "--json"]
    assert hf_generate.main(args + ["--dp", "2"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["tokens_match_cpu"] and rec["dp"] == 2 and "data parallel 2 replicas" in rec["plan"]
    assert "TP 2" in rec["plan"] and rec["decode_tokens_per_s"] == pytest.approx(4e9 / rec["tpot_ns"])
    from kbtorch.cli import UsageError
    with pytest.raises(UsageError, match="the batch of 4 does not split into 3 replicas"):
        hf_generate.main(args + ["--dp", "3"])
    with pytest.raises(ValueError, match=r"--tp 4 x --dp 2: topology 'tiny_system' has 4 chips"):
        hf_generate.main(args + ["--dp", "2", "--tp", "4"])


def test_rowwise_inside_names_a_dimension_of_the_mesh(two_chips):
    """``RowwiseParallel(inside=...)``: the weight column-sharded along that dimension,
    row-sharded along the others; an unknown dimension is refused naming the mesh's."""
    mesh = kbtorch.init_device_mesh(machine=two_chips)
    lin = torch.nn.Linear(16, 8, bias=False)
    RowwiseParallel(inside="pe").apply(lin, mesh)
    assert lin.weight.placements == (Shard(1), Shard(0))
    with pytest.raises(KeyError, match="inside='tile'.*chip"):
        RowwiseParallel(inside="tile").apply(torch.nn.Linear(16, 8), mesh)
