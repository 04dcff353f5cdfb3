"""Expert parallelism across the chips of tiny_system (4 tinychips x 4 PEs) on unmodified
Hugging Face MoE models: logits and greedy tokens equal CPU; the profile has the dispatch
and combine all-to-alls; an expert without routed tokens reads no weight bytes."""
import pytest
import torch

pytest.importorskip("transformers")

import kbtorch  # noqa: E402
from kbtorch.models.hf import build  # noqa: E402
from kbtorch.tensor.placement.mesh import chip_mesh  # noqa: E402
from kbtorch.tensor.parallel.expert_parallel import expert_modules, expert_parallel, route_counts  # noqa: E402



pytestmark = pytest.mark.usefixtures("on_tiny_system")


def _ep_model(name):
    model, ref = build(name)
    model.to("ahbm")
    expert_parallel(model, chip_mesh())
    return model, ref


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-qwen3-moe", "tiny-olmoe"])
def test_logits_and_greedy_tokens_equal_cpu(name):
    model, ref = _ep_model(name)
    ids = torch.randint(2, 128, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), kbtorch.profile() as prof:
        got = model(ids.to("ahbm")).logits.cpu()
    with torch.no_grad():
        torch.testing.assert_close(got, ref(ids).logits, rtol=1e-5, atol=1e-5)
        gen = dict(max_new_tokens=3, do_sample=False)
        assert torch.equal(model.generate(ids.to("ahbm"), **gen).cpu(), ref.generate(ids, **gen))
    names = [r.name for r in prof.records]
    layers = len(expert_modules(model))
    assert names.count("ep dispatch (all_to_all)") == names.count("ep combine (all_to_all)") == layers
    assert names.count("ep experts") == layers
    a2a = next(r for r in prof.records if r.name == "ep dispatch (all_to_all)")
    assert a2a.kernel.startswith("all_to_all") and a2a.latency_ns > 0


def test_expert_weights_live_on_their_chips():
    model, _ = _ep_model("tiny-mixtral")
    experts = expert_modules(model)[0][1]
    mesh = experts.gate_up_proj._spec.mesh
    assert mesh.shape == (4, 4) and experts.gate_up_proj.placements == (kbtorch.Shard(0), kbtorch.Shard(1))
    assert experts.down_proj.placements == (kbtorch.Shard(0), kbtorch.Shard(2))


def test_an_expert_without_tokens_reads_no_weight_bytes():
    model, _ = _ep_model("tiny-mixtral")
    experts = expert_modules(model)[0][1]
    e, i2, h = experts.gate_up_proj.shape
    per_expert = (i2 * h + h * (i2 // 2)) * 4          # float32 gate/up + down weights
    ids = torch.tensor([[5]])
    with torch.no_grad(), kbtorch.profile() as prof:
        model(ids.to("ahbm"))
    runs = [r for r in prof.records if r.name == "ep experts"]
    for r in runs:
        routed = {p.name.split()[0] for p in r.parts}
        assert len(routed) == 2                           # one token, top-2: 2 of 4 experts
        assert 2 * per_expert <= r.bytes < 3 * per_expert
        assert r.detail.startswith("2 of 4 experts routed")


def test_route_counts_by_owner_chip_and_balanced_when_timing_only():
    index = torch.tensor([[0, 1], [1, 2], [3, 0], [2, 2]])
    assert route_counts(index, False, 2, 4) == ((1, 2, 1, 0), (1, 0, 2, 1))
    assert route_counts(index, True, 2, 4) == ((1, 1, 1, 1), (1, 1, 1, 1))


def test_bad_mesh_and_a_model_without_experts_are_refused():
    model, _ = build("tiny-llama")
    with pytest.raises(ValueError, match="no experts module"):
        expert_parallel(model, chip_mesh())
    flat = kbtorch.Mesh(tuple(range(16)), (16,))
    with pytest.raises(ValueError, match="2-D mesh of"):
        expert_parallel(model, flat)
    mixed = kbtorch.Mesh(tuple(range(16)), (2, 8))
    with pytest.raises(ValueError, match="mesh row 0"):
        expert_parallel(build("tiny-mixtral")[0], mixed)
    one_chip = kbtorch.Mesh(chip_mesh().pes[:chip_mesh().shape[1]], (1, chip_mesh().shape[1]))
    with pytest.raises(ValueError, match=r"has 1 chip; .*at least 2 chips"):
        expert_parallel(build("tiny-mixtral")[0], one_chip)
    twice = expert_parallel(build("tiny-mixtral")[0], chip_mesh())
    with pytest.raises(ValueError, match="already expert parallel"):
        expert_parallel(twice, chip_mesh())
