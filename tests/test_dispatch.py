"""The dispatch pipeline's host pass on meta tensors (timing-only): results kept per op and shapes."""
import pytest
import torch

from kbtorch.tensor import dispatch
from kbtorch.tensor.dispatch import META_RESULTS, host_call

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def empty_cache():
    META_RESULTS.clear()
    yield
    META_RESULTS.clear()


def meta(*shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype, device="meta")


def same_meta(a, b):
    return (a.is_meta and b.is_meta and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
            and a.storage_offset() == b.storage_offset())


@pytest.mark.parametrize("func, args, kwargs", [
    (aten.add.Tensor, (meta(4, 3), meta(3)), {}),
    (aten.mm.default, (meta(4, 3), meta(3, 5)), {}),
    (aten.sum.dim_IntList, (meta(2, 3, 4), [1]), {"keepdim": True}),
    (aten.max.dim, (meta(2, 6), 1), {}),
    (aten.permute.default, (meta(2, 3, 4), [2, 0, 1]), {}),
    (torch.nn.functional.scaled_dot_product_attention, (meta(1, 2, 5, 8), meta(1, 2, 7, 8), meta(1, 2, 7, 8)),
     {"is_causal": False}),
])
def test_a_kept_result_equals_the_op_and_is_a_new_object_each_call(func, args, kwargs):
    expect = func(*args, **kwargs)
    first, second = host_call(func, args, kwargs), host_call(func, args, kwargs)
    flat = [torch.utils._pytree.tree_flatten(x)[0] for x in (expect, first, second)]
    for e, a, b in zip(*flat):
        floating = e.is_floating_point()
        assert same_meta(e, a) if floating else torch.equal(a, torch.zeros(e.shape, dtype=e.dtype))
        assert a is not b
        assert same_meta(a, b) if a.is_meta else torch.equal(a, b)


def test_the_second_call_does_not_run_the_op(monkeypatch):
    calls = []

    def counted(*a, **k):
        calls.append(1)
        return torch.empty(3, device="meta")

    monkeypatch.setattr(dispatch, "PURE", (counted,))
    for _ in range(3):
        assert host_call(counted, (meta(3),), {}).shape == (3,)
    assert len(calls) == 1
    host_call(counted, (meta(4),), {})             # another shape: run again
    assert len(calls) == 2


def test_ops_that_write_or_alias_are_not_kept():
    x = meta(2, 3)
    assert host_call(aten.add_.Tensor, (x, meta(3)), {}) is x
    v = host_call(aten.view.default, (x, [3, 2]), {})
    assert v._base is x or v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert not META_RESULTS


def test_scalar_types_are_told_apart():
    ints = meta(3, dtype=torch.int64)
    assert host_call(aten.add.Tensor, (ints, 1), {}).dtype == torch.int64
    assert host_call(aten.add.Tensor, (ints, 1.0), {}).dtype == torch.float32
    assert host_call(aten.add.Tensor, (ints, True), {}).dtype == torch.int64
    assert len(META_RESULTS) == 3


def test_strides_and_host_values_are_part_of_the_key():
    x = meta(4, 6)
    a = host_call(aten.neg.default, (x,), {})
    b = host_call(aten.neg.default, (x.t(),), {})
    assert a.stride() == (6, 1) and b.stride() == aten.neg.default(x.t()).stride()
    # a host tensor joining a meta one is described by its metadata only (it goes to meta)
    c = host_call(aten.mul.Tensor, (x, torch.ones(6)), {})
    assert c.is_meta and c.shape == (4, 6)


def test_integer_results_are_fresh_zeros_each_call():
    a = host_call(aten.argmax.default, (meta(2, 5),), {"dim": 1})
    a.add_(7)
    b = host_call(aten.argmax.default, (meta(2, 5),), {"dim": 1})
    assert not b.is_meta and torch.equal(b, torch.zeros(2, dtype=torch.int64))


def test_undescribed_arguments_are_not_kept_and_still_run(monkeypatch):
    def scaled(x, by):
        return torch.empty(x.shape[0] * by.n, device="meta")

    monkeypatch.setattr(dispatch, "PURE", (scaled,))
    assert host_call(scaled, (meta(3), _By(2)), {}).shape == (6,)
    assert host_call(scaled, (meta(3), _By(3)), {}).shape == (9,)
    assert not META_RESULTS


class _By:
    """An argument of a type the key does not describe."""

    def __init__(self, n):
        self.n = n


def test_handlers_run_with_the_garbage_collector_paused_and_it_is_restored(monkeypatch):
    import gc

    import kbtorch  # noqa: F401  (registers the device and its handlers)
    seen = []
    real = dispatch.HANDLERS.get(aten.neg.default) or dispatch.HANDLERS[aten.neg]

    def spy(func, args, kwargs, machine):
        seen.append(gc.isenabled())
        return real(func, args, kwargs, machine)

    monkeypatch.setitem(dispatch.HANDLERS, aten.neg.default, spy)
    x = torch.randn(4, 8).to("ahbm")
    assert gc.isenabled()
    torch.testing.assert_close((-x).cpu(), -x.cpu())
    assert seen == [False] and gc.isenabled()
