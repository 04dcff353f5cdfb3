"""The vector pass: how PEs share its elements, and its simulation mode (``mode="auto"``
counts the traffic it simulates)."""
import pytest

from kbtorch.kernel import policy
from kbtorch.kernel import build
from kbtorch.ops.vector import elementwise, elementwise_kernel, pass_mode, share
from kbtorch.sim import symmetry
from kbtorch.topology import load_machine


def test_auto_counts_the_symmetry_reduced_traffic(ahbm):
    """AHBM's 32 CUBEs run one class: a 116 M-element pass crosses links 16 M times in all
    (coarse by the whole count) but 2 M in the run simulated, so it stays fast."""
    n = 2048 * 18944 * 3
    programs = build(elementwise_kernel, range(256), ahbm, "silu", n, 2, 2, "bf16", ahbm.math_flops("silu", 0), 1.0)
    simulated = symmetry.reduce(ahbm, programs).programs        # what ``run_programs`` gives the mode
    assert policy.sim_mode("auto", ahbm, programs) == "coarse"
    assert pass_mode("auto", ahbm)(simulated) == "fast"
    assert pass_mode("coarse", ahbm) == "coarse"


def test_auto_is_coarse_above_the_crossings_and_coarse_equals_fast_on_maia200(monkeypatch):
    maia = load_machine("maia200")
    fast, coarse, auto = (elementwise("add", 2048 * 8192, dtype="bf16", machine=maia, mode=m)
                          for m in ("fast", "coarse", "auto"))
    assert auto.result.events == fast.result.events > 10 * coarse.result.events
    assert coarse.result.latency_ps == fast.result.latency_ps
    monkeypatch.setattr(policy, "COARSE_FLIT_HOPS", 0)
    again = elementwise("add", 2048 * 8192, dtype="bf16", machine=maia, mode="auto")
    assert again.result.events == coarse.result.events


@pytest.mark.parametrize("n,parts", [(0, 3), (5, 8), (1000, 288), (2**20 + 7, 36)])
def test_share_splits_every_element_once_in_near_equal_slices(n, parts):
    sizes = [share(n, parts, r) for r in range(parts)]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
