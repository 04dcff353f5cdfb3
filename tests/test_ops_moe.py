"""MoE routing and expert GEMMs on ahbm (kbtorch/tensor/handlers/moe.py): histc and bincount
counts, the grouped GEMM (one GEMM per group with rows: only routed experts read) against
CPU, on the tiny machine."""
import pytest
import torch

import kbtorch


@pytest.fixture(scope="module", autouse=True)
def tiny_machine(tiny_path):
    with kbtorch.use(str(tiny_path)):
        yield


def test_histc_of_integers_counts_as_cuda_does():
    ids = torch.tensor([3, 0, 1, 3, 3, 7], dtype=torch.int32)
    with kbtorch.profile() as prof:
        got = torch.histc(ids.to("ahbm"), bins=4, min=0, max=3)
    assert got.dtype == torch.int32 and got.cpu().tolist() == [1, 1, 0, 3]
    assert [r.name for r in prof.records] == ["aten::histc"] and prof.records[0].latency_ns > 0
    x = torch.rand(50)
    torch.testing.assert_close(torch.histc(x.to("ahbm"), bins=7).cpu(), torch.histc(x, bins=7))
    assert torch.equal(torch.bincount(ids.long().to("ahbm"), minlength=9).cpu(), torch.bincount(ids.long(), minlength=9))


def test_grouped_mm_matches_cpu_and_runs_only_routed_groups():
    torch.manual_seed(0)
    a, w = torch.randn(10, 32), torch.randn(4, 48, 32)
    offs = torch.tensor([3, 3, 10, 10], dtype=torch.int32)            # groups 1 and 3 get no rows
    want = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    with kbtorch.profile() as prof:
        got = torch._grouped_mm(a.to("ahbm"), w.to("ahbm").transpose(-2, -1), offs=offs.to("ahbm"))
    torch.testing.assert_close(got.cpu(), want)
    gemms = [r for r in prof.records if r.name == "aten::_grouped_mm"]
    assert [r.detail for r in gemms] == ["group 0: 3x48x32", "group 2: 7x48x32"]
    a3, b3 = torch.randn(2, 5, 32), torch.randn(2, 32, 16)
    torch.testing.assert_close(torch._grouped_mm(a3.to("ahbm"), b3.to("ahbm")).cpu(), torch._grouped_mm(a3, b3))


def test_grouped_mm_refuses_what_it_does_not_time():
    with pytest.raises(NotImplementedError, match="_grouped_mm.*2-D and a 2-D"):
        torch._grouped_mm(torch.randn(4, 8).to("ahbm"), torch.randn(8, 4).to("ahbm"),
                          offs=torch.tensor([4], dtype=torch.int32).to("ahbm"))


def test_timing_only_spreads_rows_over_the_groups():
    from kbtorch.tensor.handlers.moe import group_rows
    assert group_rows(torch.empty(4, dtype=torch.int32, device="meta"), 10, 4) == [3, 3, 2, 2]
    assert group_rows(torch.tensor([2, 2, 9]), 12, 3) == [2, 0, 7]
