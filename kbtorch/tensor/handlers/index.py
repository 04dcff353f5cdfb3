"""Indexing on the ahbm device: gathers (``gather``, advanced and boolean-mask indexing
``x[idx]``, ``masked_select``, ``take``, ``nonzero``) and scatters (``scatter``,
``scatter_add``, ``index_put`` (``x[idx] = v``), ``index_copy``, ``index_fill``,
``index_add``, ``masked_scatter``, in place or not).

Numerics: the torch op on the host values (index tensors may stay on the host, as torch
allows for any device). Timing: a copy pass through the DMA engines
(``ops_copy.timed_copy``) of the elements moved: a gather's output; an out-of-place
scatter's whole output (the copy of its input, written); an in-place scatter's written
elements only (the largest of its index and value operands: a KV-cache update copies the
new tokens, not the cache). Results are placed by default for their shape.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from ..dispatch import Out, host_call, is_ahbm, refuse, register, same_device
from ..placement.spec import default_spec
from .copy import timed_copy

aten = torch.ops.aten

GATHERS = ("gather", "index", "_unsafe_index", "masked_select", "take", "nonzero")
SCATTERS = ("scatter", "scatter_add", "scatter_reduce", "index_put", "index_copy", "index_fill", "index_add",
            "masked_scatter")
IN_PLACE = (*(f"{name}_" for name in SCATTERS), "_index_put_impl_")
#: ops whose index operands may be host tensors, as torch allows.
HOST_INDICES = ("index", "_unsafe_index", "index_put", "index_put_", "_index_put_impl_")


@register(*(getattr(aten, name) for name in (*GATHERS, *SCATTERS, *IN_PLACE)))
def indexing(func, args, kwargs, machine):
    name = func.overloadpacket.__name__
    refuse(func, kwargs)
    tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
    if name not in HOST_INDICES:
        same_device(name, tensors)
    out = host_call(func, args, kwargs)
    ahbm = [t for t in tensors if is_ahbm(t)]
    if name.endswith("_"):
        written = max((t for t in tensors[1:]), key=lambda t: t.numel(), default=args[0])
        runs = (timed_copy(machine, name, ahbm, written, None),) if written.numel() else ()
        return Out(args[0], runs=runs)
    spec = default_spec(machine, tuple(out.shape))
    runs = (timed_copy(machine, name, ahbm, out, spec.placements[0]),) if out.numel() else ()
    return Out(out, spec, runs=runs)
