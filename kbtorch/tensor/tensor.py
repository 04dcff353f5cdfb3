"""``AhbmTensor``: a tensor on the ``"ahbm"`` device, its numeric data and its placement.

A thin wrapper subclass (``torch.Tensor._make_wrapper_subclass``), in the manner of DTensor:
it holds ``_value`` (the numeric value as one host tensor: the GLOBAL value, not a PE's
part) and ``_spec`` (its ``placement.Spec`` over a mesh of PEs of one machine). Numerics are
computed with torch on ``_value``; timing belongs to the kernels that ops dispatch to. Every
op goes to ``dispatch.dispatch``.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .. import state
from .dispatch import DEVICE, dispatch, value_of
from .hbm import hbm_book
from .placement.spec import Spec, expand
from .redistribute import full_tensor, redistribute

_TIMING_ONLY: ContextVar = state.context_var("kbtorch_timing_only", False)


@contextmanager
def timing_only():
    """Inside this block (in this thread or task only) new ahbm tensors hold no data (a meta
    tensor inside): ops still run their kernels on the simulator, so full-size models fit in
    memory; asking for values (``.cpu()``) raises."""
    token = _TIMING_ONLY.set(True)
    try:
        yield
    finally:
        _TIMING_ONLY.reset(token)


def is_timing_only() -> bool:
    return _TIMING_ONLY.get()


#: torch functions forwarded whole to ``dispatch``, as the aten op of the same signature.
WHOLE = {
    torch.nn.functional.scaled_dot_product_attention: torch.ops.aten.scaled_dot_product_attention.default,
    torch.nn.functional.rms_norm: torch.ops.aten.rms_norm.default,
    torch.nn.functional.layer_norm: torch.ops.aten.layer_norm.default,
}

_WHOLE_OPS = frozenset(WHOLE.values())


class AhbmTensor(torch.Tensor):
    """A tensor on ``ahbm``: ``_value`` (its global value on the host) and ``_spec`` (placement)."""

    _value: torch.Tensor
    _spec: Spec

    @staticmethod
    def __new__(cls, value: torch.Tensor, spec: Spec, requires_grad: bool = False, owns: bool = True):
        """``owns``: the tensor has a buffer of its own in HBM (not a view), which must fit."""
        r = torch.Tensor._make_wrapper_subclass(cls, value.shape, strides=value.stride(), dtype=value.dtype,
                                                device=torch.device(DEVICE, 0), requires_grad=requires_grad)
        r._value, r._spec = value, spec
        if owns:
            hbm_book(spec.mesh.machine).reserve(r, spec, tuple(value.shape), value.numel() * value.element_size())
        return r

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"AhbmTensor({self._value!r}, device='{DEVICE}:0', placements={list(self._spec.placements)})"

    def __tensor_flatten__(self):
        return ["_value"], self._spec

    @staticmethod
    def __tensor_unflatten__(inner: dict, spec, outer_size, outer_stride):
        return AhbmTensor(inner["_value"], spec, owns=False)

    def __deepcopy__(self, memo) -> "AhbmTensor":
        """A new tensor of the same value and placement on the same machine (HBM of its own)."""
        if id(self) not in memo:
            memo[id(self)] = AhbmTensor(self._value.clone(), self._spec, requires_grad=self.requires_grad)
        return memo[id(self)]

    def __reduce_ex__(self, protocol):
        # NOTE: pickled as its value and placement; the machine pickles as its content and
        # is found again on loading (``Machine.__reduce__``), so a loaded tensor mixes with
        # the tensors of this process.
        return (_rebuild, (self._value, self._spec, self.requires_grad))

    def data_ptr(self) -> int:
        """An address distinct per storage, as on any device (a view: its base's plus its
        offset): the host value's; a timing-only tensor (no data) has its storage's identity."""
        v = self._value
        if v.device.type == "meta":
            return v.untyped_storage()._cdata + v.storage_offset() * v.element_size()
        return v.data_ptr()

    @property
    def placements(self) -> tuple:
        return self._spec.placements

    @property
    def device_mesh(self):
        """The mesh this tensor is placed on (as DTensor's ``device_mesh``)."""
        return self._spec.mesh

    @property
    def machine(self):
        """The machine this tensor lives on."""
        return self._spec.mesh.machine

    def redistribute(self, placements) -> "AhbmTensor":
        """This tensor with new placements; the collective it needs is timed."""
        return redistribute(self, placements)

    def full_tensor(self) -> torch.Tensor:
        return full_tensor(self)

    def tolist(self):
        """The values as Python numbers (nested lists), copied to the host as ``.cpu()`` does."""
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False):
        """Refused, as for any device tensor: a NumPy array would alias host memory."""
        raise TypeError(f"can't convert {DEVICE}:0 device type tensor to numpy. "
                        "Use Tensor.cpu() to copy the tensor to host memory first.")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """The fused functions of ``WHOLE`` (SDPA, the norms) are forwarded whole to
        ``dispatch`` as their aten op; everything else goes on to ``__torch_dispatch__``.

        NOTE: outside inference mode torch decomposes a composite op such as ``layer_norm``
        before dispatch; forwarded here, it is one fused kernel in every grad mode."""
        # NOTE: the aten overloads themselves too, as an aten graph (torch.compile) calls them.
        whole = WHOLE.get(func) or (func if func in _WHOLE_OPS else None)
        if whole is not None:
            return dispatch(cls, whole, args, kwargs or {})
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return dispatch(cls, func, args, kwargs or {})


def _rebuild(value: torch.Tensor, spec: Spec, requires_grad: bool) -> AhbmTensor:
    return AhbmTensor(value, spec, requires_grad=requires_grad)


def distribute_tensor(t: torch.Tensor, mesh, placements) -> AhbmTensor:
    """A host tensor placed on ``mesh`` (untimed deployment, like ``.to("ahbm")``); on a
    sub-mesh (``mesh["pe"]``) it is replicated along the parent's other dimensions."""
    spec = Spec(*expand(mesh, placements))
    spec.check(tuple(t.shape))
    for pe in spec.mesh.pes:
        if not 0 <= pe < len(spec.mesh.machine.pes):
            raise ValueError(f"mesh PE {pe} is outside topology '{spec.mesh.machine.name}'")
    value = value_of(t) if isinstance(t, AhbmTensor) else t.detach().to("cpu").clone()
    return AhbmTensor(value, spec)
