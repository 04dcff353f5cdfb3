"""Pipeline parallelism over the chip groups of tiny_system (4 tinychips x 4 PEs): tiny
Llama with PP 2 equals CPU (logits, greedy tokens, padded batches); micro-batches overlap
across stages, so the latency is about (m + p - 1) stage times; each stage has its own
trace track."""
import json

import pytest
import torch

pytest.importorskip("transformers")

import kbtorch  # noqa: E402
from kbtorch.models.hf import build  # noqa: E402
from kbtorch.tensor.placement.mesh import chip_mesh  # noqa: E402
from kbtorch.tensor.parallel.pipeline_parallel import pipeline_parallel, split_layers  # noqa: E402
from kbtorch.tensor.stream import clock_ns  # noqa: E402



pytestmark = pytest.mark.usefixtures("on_tiny_system")


def _pp(stages=2, microbatches=2, name="tiny-llama"):
    model, ref = build(name)
    model.to("ahbm")
    pipeline_parallel(model, chip_mesh(), stages, microbatches)
    return model, ref


def test_logits_and_greedy_tokens_equal_cpu_with_padding():
    model, ref = _pp()
    ids = torch.randint(2, 128, (4, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :2] = mask[3, :1] = 0
    with torch.no_grad():
        got = model(ids.to("ahbm"), attention_mask=mask.to("ahbm")).logits.cpu()
        want = ref(ids, attention_mask=mask).logits
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-5, atol=1e-5)
        gen = dict(max_new_tokens=3, do_sample=False)
        out = model.generate(ids.to("ahbm"), attention_mask=mask.to("ahbm"), **gen).cpu()
        assert torch.equal(out, ref.generate(ids, attention_mask=mask, **gen))


def test_stages_hold_their_layers_weights():
    model, _ = _pp()
    layers = model.model.layers
    assert set(layers[0].self_attn.q_proj.weight._spec.mesh.pes) == set(range(8))
    assert set(layers[1].mlp.down_proj.weight._spec.mesh.pes) == set(range(8, 16))
    assert set(model.model.embed_tokens.weight._spec.mesh.pes) == set(range(8))
    assert set(model.lm_head.weight._spec.mesh.pes) == set(range(8, 16))
    assert split_layers(5, 2) == [range(0, 3), range(3, 5)]


def test_latency_is_m_plus_p_minus_1_stage_times_and_the_bubble_shows(tmp_path):
    m, p = 4, 2
    model, _ = _pp(p, m)
    ids = torch.randint(2, 128, (m, 16), generator=torch.Generator().manual_seed(1))
    start = clock_ns()
    with torch.no_grad(), kbtorch.profile() as prof:
        model(ids.to("ahbm"))
    latency = clock_ns() - start
    busy = {}
    for r in prof.records:
        busy.setdefault(r.track, []).append(r)
    stage = sum(r.latency_ns for r in busy["pp stage 0"]) / m       # one micro-batch on one stage
    sends = [r.latency_ns for r in busy["pp sends"]]
    hop = max(sends)
    expect = (m + p - 1) * stage + 2 * hop                           # a hop to stage 1, the logits back
    assert abs(latency - expect) / expect < 0.05
    assert prof.span_ns == pytest.approx(latency) and prof.total_ns > latency
    assert latency < 0.75 * m * p * stage                            # stages overlap
    first = min(r.start_ns for r in busy["pp stage 1"]) - start      # stage 1 idles: the bubble
    assert first >= stage
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    names = {e["args"]["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "M"}
    assert {"pp stage 0", "pp stage 1", "pp sends"} <= names


def test_one_micro_batch_runs_the_stages_one_after_another():
    model, _ = _pp(2, 1)
    ids = torch.randint(2, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    start = clock_ns()
    with torch.no_grad(), kbtorch.profile() as prof:
        model(ids.to("ahbm"))
    assert clock_ns() - start == pytest.approx(sum(r.latency_ns for r in prof.records), rel=1e-9)


def test_bad_plans_are_refused():
    model, _ = build("tiny-llama")
    model.to("ahbm")
    with pytest.raises(ValueError, match="3 stages do not split the mesh's 4 chips"):
        pipeline_parallel(model, chip_mesh(), 3, 1)
    with pytest.raises(ValueError, match="cannot fill 4 stages"):
        pipeline_parallel(model, chip_mesh(), 4, 1)
    pipeline_parallel(model, chip_mesh(), 2, 3)
    with pytest.raises(ValueError, match="already pipelined"):
        pipeline_parallel(model, chip_mesh(), 2, 1)
    with pytest.raises(ValueError, match="a batch of 2 cannot make 3 micro-batches"):
        model(torch.ones(2, 3, dtype=torch.long).to("ahbm"))
    with pytest.raises(ValueError, match="no list of decoder layers"):
        pipeline_parallel(torch.nn.Linear(4, 4), chip_mesh(), 2, 1)


def test_a_stage_called_alone_is_refused_and_the_scope_is_left_clean():
    from kbtorch.tensor.placement.spec import SCOPE
    model, _ = _pp(2, 1)
    x = torch.ones(1, 2, 64).to("ahbm")
    with pytest.raises(RuntimeError, match="outside the pipelined model's forward"):
        model.model.layers[1](x)
    with torch.no_grad():
        model(torch.ones(1, 3, dtype=torch.long).to("ahbm"))
    assert SCOPE.get() is None
