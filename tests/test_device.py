"""The "ahbm" torch device: registration, moves, factories, modules, placements, errors."""
import pytest
import torch

import kbtorch
from kbtorch.tensor import AhbmTensor, Mesh, Partial, Replicate, Shard, Spec
from kbtorch.tensor.device import register


def test_register_is_idempotent_and_names_the_device():
    register()
    register()
    assert torch._C._get_privateuse1_backend_name() == "ahbm"
    assert torch.device("ahbm").type == "ahbm"
    assert torch.device("ahbm:0").index == 0


def test_to_and_back_keeps_values_and_dtype():
    x = torch.randn(3, 5, dtype=torch.float16)
    y = x.to("ahbm")
    assert isinstance(y, AhbmTensor) and y.device == torch.device("ahbm", 0)
    assert y.placements == (Replicate(),)
    back = y.cpu()
    assert type(back) is torch.Tensor and back.device.type == "cpu"
    assert torch.equal(back, x) and back.dtype == torch.float16
    assert torch.equal(x.to("ahbm:0").to("cpu"), x)


@pytest.mark.parametrize("make, expect", [
    (lambda: torch.empty(2, 3, device="ahbm"), lambda t: t.shape == (2, 3)),
    (lambda: torch.zeros(2, 3, device="ahbm"), lambda t: torch.equal(t.cpu(), torch.zeros(2, 3))),
    (lambda: torch.ones(4, device="ahbm", dtype=torch.bfloat16), lambda t: torch.equal(t.cpu(), torch.ones(4, dtype=torch.bfloat16))),
    (lambda: torch.arange(6, device="ahbm"), lambda t: torch.equal(t.cpu(), torch.arange(6))),
    (lambda: torch.tensor([1.5, 2.5], device="ahbm"), lambda t: torch.equal(t.cpu(), torch.tensor([1.5, 2.5]))),
])
def test_factories(make, expect):
    t = make()
    assert isinstance(t, AhbmTensor) and t.device.type == "ahbm"
    assert expect(t)


def test_randn_on_device_has_the_shape_and_dtype():
    t = torch.randn(8, 4, device="ahbm", dtype=torch.float16)
    assert t.shape == (8, 4) and t.dtype == torch.float16 and t.cpu().isfinite().all()


def test_module_to_keeps_parameter_identity():
    m = torch.nn.Linear(4, 3)
    w, b = m.weight, m.bias
    ref = w.detach().clone()
    m.to("ahbm")
    assert m.weight is w and m.bias is b
    assert isinstance(m.weight, torch.nn.Parameter) and m.weight.device.type == "ahbm"
    assert torch.equal(m.weight.cpu(), ref)


def test_views_are_metadata():
    x = torch.randn(3, 4)
    y = x.to("ahbm")
    assert torch.equal(y.t().cpu(), x.t())
    assert torch.equal(y.view(12).cpu(), x.view(12))
    assert torch.equal(y.permute(1, 0).cpu(), x.permute(1, 0))


def test_repr_shows_device_and_placement():
    text = repr(torch.ones(2).to("ahbm"))
    assert "ahbm:0" in text and "Replicate()" in text


def test_unsupported_op_names_itself():
    y = torch.randn(2, 2).to("ahbm")
    with pytest.raises(NotImplementedError, match=r"aten\._linalg_svd"):
        torch.linalg.svd(y)


def test_placements_validate():
    mesh = Mesh(tuple(range(8)), (2, 4))
    spec = Spec(mesh, (Shard(0), Replicate()))
    spec.check((16, 4))
    with pytest.raises(ValueError, match="Shard"):
        Spec(mesh, (Shard(3), Partial())).check((16, 4))
    with pytest.raises(ValueError, match="placements"):
        Spec(mesh, (Replicate(),))
    with pytest.raises(ValueError, match="needs 8 PEs"):
        Mesh(tuple(range(7)), (2, 4))


def test_hbm_full_is_a_clear_error_and_changes_nothing():
    import gc

    from kbtorch.tensor.hbm import HbmFull, hbm_book
    book = hbm_book(kbtorch.current_machine())
    gc.collect()

    def free():
        return {pe: book.free(pe) for pe in range(256)}
    before = free()
    with kbtorch.timing_only():
        with pytest.raises(HbmFull, match=r"does not fit in PE 0's HBM"):
            torch.empty(255, 255, 255, 200, dtype=torch.float16, device="ahbm")   # 6.6 GB on every PE
        assert free() == before
        w = torch.empty(18944, 3584, dtype=torch.float16, device="ahbm")           # sharded: 530 KB a PE
        assert w.placements == (Shard(0),)
        assert before[0] - book.free(0) == -(-18944 * 3584 * 2 // 256)
    del w
    gc.collect()
    assert free() == before


def test_views_move_the_sharded_dimension():
    w = torch.randn(512, 1024).to("ahbm")
    assert w.placements == (Shard(0),)
    assert w.t().placements == (Shard(1),) and w.transpose(0, 1).placements == (Shard(1),)
    assert w.view(512, 32, 32).placements == (Shard(0),) and w.unsqueeze(0).placements == (Shard(1),)
    assert w.view(1024, 512).placements == (Replicate(),)          # merges the sharded dim: re-layout
    x = torch.randn(4, 300, 256).to("ahbm")
    assert x.permute(2, 0, 1).placements == (Shard(2),)
    assert torch.randn(512, 64).to("ahbm").placements == (Replicate(),)    # small: replicated
    h = kbtorch.distribute_tensor(torch.randn(4, 3584), kbtorch.Mesh(tuple(range(256)), (256,)), [Shard(1)])
    assert h.view(4, 28, 128).placements == (Shard(1),)            # split: the shard goes to the heads
    assert h.view(4, 28, 128).view(4, 3584).placements == (Shard(1),)    # merged back
    assert torch.equal(x.permute(2, 0, 1).cpu(), x.cpu().permute(2, 0, 1))
