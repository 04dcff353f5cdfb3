"""Convolutions (a GEMM for groups=1, a vector pass for depthwise) and complex elementwise ops
(``torch.polar``, complex multiplies: DeepSeek-V2's rotary embedding) on the ahbm device:
numerics against CPU, the work each is timed with, and the refusals by name."""
import pytest
import torch
import torch.nn.functional as F

import kbtorch


@pytest.fixture(autouse=True)
def tiny():
    with kbtorch.use("tests/data/tiny.toml"):
        yield kbtorch.current_machine()


def _records(fn):
    with kbtorch.profile() as prof:
        out = fn()
    return out, prof.records


def test_depthwise_conv1d_is_one_vector_pass_of_taps_fmas(tiny):
    x, w, b = torch.randn(2, 16, 40), torch.randn(16, 1, 4), torch.randn(16)
    y, recs = _records(lambda: F.conv1d(x.to("ahbm"), w.to("ahbm"), b.to("ahbm"), padding=3, groups=16))
    torch.testing.assert_close(y.cpu(), F.conv1d(x, w, b, padding=3, groups=16))
    (rec,) = recs
    assert rec.kernel == "elementwise fma" and rec.detail == "depthwise, 4 taps"
    assert rec.flops == (4 * tiny.math_flops("fma") + tiny.math_flops("add")) * y.numel()


def test_conv_of_one_group_is_an_im2col_gemm(tiny):
    x, w = torch.randn(2, 16, 40), torch.randn(8, 16, 3)
    y, recs = _records(lambda: F.conv1d(x.to("ahbm"), w.to("ahbm"), padding=1))
    torch.testing.assert_close(y.cpu(), F.conv1d(x, w, padding=1))
    (rec,) = recs
    assert rec.kernel == "gemm" and rec.flops == 2 * (2 * 40) * 8 * (16 * 3)
    _, (longer,) = _records(lambda: F.conv1d(torch.randn(2, 16, 80).to("ahbm"), w.to("ahbm"), padding=1))
    assert longer.flops == 2 * rec.flops and longer.latency_ns >= rec.latency_ns


@pytest.mark.parametrize("call, words", [
    (lambda: F.conv1d(torch.randn(1, 16, 8).to("ahbm"), torch.randn(8, 8, 3).to("ahbm"), groups=2), "groups=2"),
    (lambda: F.conv_transpose1d(torch.randn(1, 4, 8).to("ahbm"), torch.randn(4, 2, 3).to("ahbm")), "transposed"),
    (lambda: torch.exp(torch.polar(torch.ones(4).to("ahbm"), torch.zeros(4).to("ahbm"))), "exp on complex"),
])
def test_unsupported_variants_are_refused_by_name(call, words):
    with pytest.raises(NotImplementedError, match=words):
        call()


def test_complex_multiply_of_polar_values_matches_cpu_and_costs_six_ops(tiny):
    r, t, x = torch.rand(4, 8), torch.randn(4, 8), torch.randn(4, 8, 2)
    def run():
        z = torch.polar(r.to("ahbm"), t.to("ahbm"))
        return torch.view_as_real(torch.view_as_complex(x.to("ahbm")) * z)
    y, recs = _records(run)
    torch.testing.assert_close(y.cpu(), torch.view_as_real(torch.view_as_complex(x) * torch.polar(r, t)))
    polar, mul = (rec for rec in recs if rec.name in ("aten::polar", "aten::mul"))
    assert polar.flops == (2 * tiny.math_flops("transcendental") + 2 * tiny.math_flops("mul")) * 32
    assert mul.flops == 6 * tiny.math_flops("mul") * 32
