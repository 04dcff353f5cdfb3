"""Untimed ops on the ahbm device: views (metadata) and writes from the host.

Host queries (``.item()``, ``torch.equal``) read a value back, untimed. Views (``view``, ``transpose``, ``slice``, ...) are metadata on the PEs too as long as the
layout allows: no kernel, no time, no HBM of their own; their placement follows
``placement.view_placements``. Host writes (``fill_``, random init, ``lift_fresh``, ...)
are the host's untimed deployment; a copy to another device (``.to("cpu")``, ``.cpu()``)
returns a plain tensor there.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..dispatch import DEVICE, Out, is_ahbm, register, value_of
from ..placement.spec import Spec, view_placements

aten = torch.ops.aten

VIEWS = ("detach", "alias", "view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
         "slice", "select", "as_strided", "_reshape_alias", "diagonal", "unfold", "view_as_real", "view_as_complex")
QUERIES = ("_local_scalar_dense", "equal", "is_nonzero", "is_same_size")
HOST_WRITES = ("zero_", "fill_", "normal_", "uniform_", "random_", "bernoulli_", "to", "arange", "lift_fresh",
               "set_", "resize_")


def leaves_device(func, kwargs) -> bool:
    """Whether ``func`` is a copy to another device (``_to_copy``/``to`` with a ``device``
    that is not ahbm)."""
    device = kwargs.get("device")
    return func.overloadpacket in (aten._to_copy, aten.to) and device is not None and torch.device(device).type != DEVICE


def off_device(func, args, kwargs):
    """A copy to another device (``leaves_device``): the value there as a plain tensor; None
    for anything else."""
    if not leaves_device(func, kwargs):
        return None
    if args[0]._value.is_meta:
        raise RuntimeError(f"kbtorch: this ahbm tensor {tuple(args[0].shape)} was made in timing-only mode "
                           f"and holds no data; its values are not available")
    return func(args[0]._value, *args[1:], **kwargs)


def _first_ahbm(args, kwargs):
    return next(a for a in tree_flatten((args, kwargs))[0] if is_ahbm(a))


def _on_host(func, args, kwargs):
    if "device" in kwargs:
        kwargs = dict(kwargs, device=torch.device("cpu"))
    return func(*tree_map(value_of, args), **tree_map(value_of, kwargs))


@register(*(getattr(aten, name) for name in VIEWS))
def view(func, args, kwargs, machine):
    """A view of its first ahbm argument: same buffer, placement moved with the dimensions."""
    base = _first_ahbm(args, kwargs)
    out = _on_host(func, args, kwargs)
    spec = base._spec
    placed = view_placements(spec.placements, func.overloadpacket.__name__, args, tuple(base.shape), tuple(out.shape))
    return Out(out, Spec(spec.mesh, placed), view_of=base)


@register(*(getattr(aten, name) for name in HOST_WRITES))
def host_write(func, args, kwargs, machine):
    """The op on the host values: in place (or into ``out``) returns its target; a new
    tensor keeps the placement of the first ahbm argument."""
    moved = off_device(func, args, kwargs)
    if moved is not None:
        return moved
    spec = _first_ahbm(args, kwargs)._spec
    out = _on_host(func, args, kwargs)
    if is_ahbm(kwargs.get("out")):
        return kwargs["out"]
    if func.overloadpacket.__name__.endswith("_") and is_ahbm(args[0]):
        return args[0]
    return Out(out, spec)


@register(*(getattr(aten, name) for name in QUERIES))
def query(func, args, kwargs, machine):
    """A Python value read back by the host (``.item()``, ``torch.equal``): untimed."""
    values = [value_of(a) for a in args]
    if any(isinstance(v, torch.Tensor) and v.is_meta for v in values):
        raise RuntimeError(f"kbtorch: {func} needs values, but an ahbm tensor was made in timing-only mode and "
                           f"holds no data")
    return func(*values, **kwargs)
