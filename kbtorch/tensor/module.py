"""``module.to("ahbm")`` (and back) all or nothing, whatever autograd still holds.

torch moves a module's parameters one by one (``nn.Module._apply``) and, for a wrapper
subclass such as ``AhbmTensor``, swaps each one (``torch.utils.swap_tensors``). A swap is
refused while autograd still references the parameter (after a CPU forward in grad mode,
``_apply(): Couldn't swap Linear.weight``), and any failure midway (a swap, ``HbmFull``)
leaves the module half moved. ``apply_all_or_nothing`` first checks that a module moving to
ahbm fits the machine's HBM (``HbmFull`` naming the first tensor past it, before any tensor
is converted), then converts every parameter,
gradient and buffer (nothing is changed if one fails), then commits: in place where the
types allow (``param.data = ...``), else by swap, else, where a swap is refused, by a new
``Parameter`` in the module (shared parameters stay shared).

NOTE: installed over ``nn.Module._apply`` by ``device.register``; a conversion that touches
no ahbm tensor runs torch's own ``_apply`` on the converted values.
"""
from __future__ import annotations

import torch
from torch import nn

from .dispatch import is_ahbm
from .hbm import check_hbm

TORCH_APPLY = nn.Module._apply


def _converted(module: nn.Module, fn, recurse: bool) -> dict:
    """id(tensor) -> (tensor, fn(tensor)) for every parameter, gradient and buffer."""
    memo: dict = {}
    modules = module.modules() if recurse else (module,)
    with torch.no_grad():
        for m in modules:
            tensors = [*m._parameters.values(), *m._buffers.values()]
            tensors += [p.grad for p in m._parameters.values() if p is not None]
            for t in tensors:
                if t is not None and id(t) not in memo:
                    memo[id(t)] = (t, fn(t))
    return memo


def _commit(param: nn.Parameter, new: torch.Tensor) -> nn.Parameter:
    """``param`` holding ``new``: in place if the types allow, else swapped, else a new Parameter."""
    if torch._has_compatible_shallow_copy_type(param, new) \
            and not torch.__future__.get_overwrite_module_params_on_conversion():
        param.data = new
        return param
    fresh = nn.Parameter(new, requires_grad=param.requires_grad)
    try:
        torch.utils.swap_tensors(param, fresh)
        return param
    except RuntimeError:
        # NOTE: refused while autograd references ``param``: the module gets a new Parameter.
        return fresh


def check_fits(module: nn.Module, fn, recurse: bool) -> None:
    """``HbmFull`` if ``fn`` moves ``module``'s tensors to ahbm and their bytes (in the dtype
    ``fn`` gives) would not fit the HBM free on the current machine, each placed by default.

    NOTE: ``fn`` is probed on an empty host tensor of each dtype: it tells the target
    device and dtype without converting (or allocating) anything."""
    named = [(n, t) for n, t in (*module.named_parameters(recurse=recurse), *module.named_buffers(recurse=recurse))
             if t is not None and not is_ahbm(t)]
    probes: dict = {}
    items = []
    for name, t in named:
        if t.dtype not in probes:
            probes[t.dtype] = fn(torch.empty(0, dtype=t.dtype))
        probe = probes[t.dtype]
        if is_ahbm(probe):
            items.append((name, tuple(t.shape), t.numel() * probe.element_size()))
    if items:
        check_hbm(type(module).__name__, items)


def apply_all_or_nothing(self: nn.Module, fn, recurse: bool = True) -> nn.Module:
    """``nn.Module._apply`` that never leaves a module split across devices (module doc)."""
    with torch.no_grad():
        check_fits(self, fn, recurse)
    memo = _converted(self, fn, recurse)
    if not any(is_ahbm(old) or is_ahbm(new) for old, new in memo.values()):
        return TORCH_APPLY(self, lambda t: memo[id(t)][1] if id(t) in memo else fn(t), recurse)
    done: dict = {}
    for m in (self.modules() if recurse else (self,)):
        for key, p in m._parameters.items():
            if p is None:
                continue
            if id(p) not in done:
                grad, p.grad = p.grad, None
                done[id(p)] = _commit(p, memo[id(p)][1])
                if grad is not None:
                    done[id(p)].grad = memo[id(grad)][1]
            m._parameters[key] = done[id(p)]
        for key, b in m._buffers.items():
            if b is not None:
                m._buffers[key] = memo[id(b)][1]
    return self
