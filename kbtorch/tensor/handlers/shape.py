"""Shape ops on the ahbm device: views that return several tensors (``split``,
``unbind``, what ``chunk`` and ``narrow`` become) and shape ops that copy (``stack``,
``repeat``, ``flip``, ``roll``, ``tril``/``triu``, padding, ``repeat_interleave``,
``*_scatter``).

Numerics: the torch op on the host values. Timing: views are metadata (no kernel, no HBM
of their own); a copying op is the copy pass of its output (``ops_copy.timed_copy``: every
output element moved once through the DMA engines), placed by default for its shape; an
in-place one (``tril_``) rewrites its target.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from ..dispatch import Out, host_call, is_ahbm, refuse, register, same_device
from ..placement.sharding import placement
from ..placement.spec import Replicate, Shard, default_spec
from ..timing import on
from .copy import timed_copy
from .reduce import reduced_dims

aten = torch.ops.aten

SPLITS = ("split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "unbind", "tensor_split")
COPIES = ("stack", "repeat", "flip", "roll", "tril", "triu", "constant_pad_nd", "repeat_interleave", "select_scatter",
          "slice_scatter", "diagonal_scatter", "tril_", "triu_")


@register(*(getattr(aten, name) for name in SPLITS))
def split(func, args, kwargs, machine):
    """Views of ``args[0]``: a shard along the split dimension is taken as replicated (as
    any view of a sharded dimension that does not keep it, ``placement.view_placements``)."""
    base = args[0]
    out = host_call(func, args, kwargs)
    dim = reduced_dims(func, args, kwargs, base.dim())[0] % max(1, base.dim())
    p = placement(base)
    if isinstance(p, Shard):
        d = p.dim % base.dim()
        p = Replicate() if d == dim else Shard(d - 1) if func.overloadpacket is aten.unbind and d > dim else p
    return Out(list(out), on(base, p or Replicate()), view_of=base)


@register(*(getattr(aten, name) for name in COPIES))
def copying(func, args, kwargs, machine):
    """A shape op that writes a new tensor (in place: its target)."""
    name = func.overloadpacket.__name__
    refuse(func, kwargs)
    tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    same_device(name, tensors)
    out = host_call(func, args, kwargs)
    target = args[0] if name.endswith("_") else out
    spec = default_spec(machine, tuple(target.shape))
    runs = (timed_copy(machine, name, [t for t in tensors if is_ahbm(t)], target, spec.placements[0]),) \
        if target.numel() else ()
    if name.endswith("_"):
        return Out(args[0], runs=runs)
    return Out(out, spec, runs=runs)
