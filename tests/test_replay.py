"""Replay is safe (issue 45): a ``kbtorch.graphed`` timing-only call replays only while what
its graph read is unchanged: module attributes that flip a branch, tensors a function closes
over or names as globals; on a change it is captured again and ``recaptures`` says why."""
import torch

import kbtorch


class _Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.wide = torch.nn.Linear(32, 64), torch.nn.Linear(32, 256), False

    def forward(self, x):
        return self.b(x) if self.wide else self.a(x)


def test_a_module_attribute_that_flips_a_branch_recaptures(small):
    with kbtorch.timing_only():
        m = kbtorch.graphed(_Branchy().to("ahbm"))
        x = torch.empty(4, 32, device="ahbm")
        assert m(x).shape == m(x).shape == (4, 64) and m.forward.graphs["replayed"] == 1
        m.wide = True
        assert m(x).shape == (4, 256) and m.forward.graphs["replayed"] == 1
        assert m.forward.recaptures == ["module attribute 'wide' changed"]
        assert m(x).shape == (4, 256) and m.forward.graphs["replayed"] == 2


def _closing_over(w):
    def fn(x):
        return x @ w[0]
    return fn


def test_a_closure_whose_weight_grew_recaptures(small):
    with kbtorch.timing_only():
        box = [torch.empty(32, 64, device="ahbm")]
        g = kbtorch.graphed(_closing_over(box))
        x = torch.empty(4, 32, device="ahbm")
        assert g(x).shape == g(x).shape == (4, 64) and g.graphs["replayed"] == 1
        box[0] = torch.empty(32, 256, device="ahbm")
        assert g(x).shape == (4, 256)
        assert g.recaptures == ["closure/global 'w' changed"]


def test_a_cell_rebound_to_a_new_weight_recaptures(small):
    with kbtorch.timing_only():
        w = torch.empty(32, 64, device="ahbm")

        def fn(x):
            return x @ w
        g = kbtorch.graphed(fn)
        x = torch.empty(4, 32, device="ahbm")
        g(x), g(x)
        w = torch.empty(32, 256, device="ahbm")
        assert g(x).shape == (4, 256) and g.graphs["replayed"] == 1


def test_a_changed_batch_recaptures(small):
    with kbtorch.timing_only():
        m = kbtorch.graphed(_Branchy().to("ahbm"))
        m(torch.empty(4, 32, device="ahbm")), m(torch.empty(4, 32, device="ahbm"))
        assert m(torch.empty(8, 32, device="ahbm")).shape == (8, 64)
        assert m.forward.recaptures == ["argument 0 changed"]


def test_a_static_cache_model_whose_batch_changes_recaptures(small):
    """A graphed static-cache generate at batch 1, then 2, then 1 again: the new batch is
    captured (no meta copy), the old one replays again (issue 45)."""
    import pytest
    pytest.importorskip("transformers")
    from kbtorch.models.hf import build
    with kbtorch.timing_only():
        model, _ = build("tiny-llama", torch.bfloat16, timing_only=True)
        model.to("ahbm")
    kbtorch.graphed(model)
    for b in (1, 2, 1):
        ids = torch.randint(2, 100, (b, 6))
        with kbtorch.timing_only(), torch.no_grad():
            out = model.generate(ids.to("ahbm"), attention_mask=torch.ones_like(ids).to("ahbm"), max_new_tokens=3,
                                 min_new_tokens=3, do_sample=False, cache_implementation="static")
        assert tuple(out.shape) == (b, 9)
    assert model.forward.graphs["replayed"] >= 3 and "argument input_ids changed" in model.forward.recaptures
