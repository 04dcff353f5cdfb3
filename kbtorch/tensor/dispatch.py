"""Op handlers of the ahbm device, registered by decorator on aten op names.

A handler takes ``(func, args, kwargs)`` with ``AhbmTensor`` arguments, computes the value
with torch on the local data (the numeric pass), runs its tile kernel on the simulator
(the timing pass), records the op on the stream and returns ``AhbmTensor`` results.
"""
from __future__ import annotations

import torch

HANDLERS: dict = {}


def implements(*names: str):
    """Register the decorated handler for the aten ops ``names`` (overload packet names)."""
    def wrap(fn):
        for name in names:
            if name in HANDLERS:
                raise ValueError(f"aten op '{name}' has two handlers")
            HANDLERS[name] = fn
        return fn
    return wrap


def same_device(op: str, args) -> None:
    """torch's error for a mix of ahbm and cpu tensors."""
    from .tensor import AhbmTensor
    devices = {("ahbm" if isinstance(a, AhbmTensor) else a.device.type) for a in args if isinstance(a, torch.Tensor)}
    if len(devices) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{' and '.join(sorted(devices))}! (when checking arguments of {op})")
