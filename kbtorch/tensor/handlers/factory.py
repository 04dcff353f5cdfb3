"""Factories from ahbm tensors: ``zeros_like``, ``ones_like``, ``full_like``,
``empty_like``, ``rand*_like``, ``new_zeros``, ``new_ones``, ``new_full``, ``new_empty``.

Like the host writes of ``ops_meta`` (``fill_``, ``arange`` into an ahbm tensor, the
factories ``torch.zeros(..., device="ahbm")`` become) they are the host's untimed
deployment: the value is made on the host (nothing in timing-only mode for a
floating-point tensor) and placed by default for its shape. A ``device=`` that is not
ahbm returns a plain tensor there.
"""
from __future__ import annotations

import torch

from ..dispatch import DEVICE, Out, host_call, register
from ..placement.spec import default_spec

aten = torch.ops.aten

LIKE = ("zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "randint_like", "new_zeros",
        "new_ones", "new_full", "new_empty", "new_empty_strided")


@register(*(getattr(aten, name) for name in LIKE))
def factory(func, args, kwargs, machine):
    device = kwargs.get("device")
    out = host_call(func, args, kwargs)
    if device is not None and torch.device(device).type != DEVICE:
        return out.to(device)
    return Out(out, default_spec(machine, tuple(out.shape)))
