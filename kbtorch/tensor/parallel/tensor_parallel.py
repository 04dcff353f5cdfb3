"""Tensor parallelism for ``nn.Module``s on ahbm, in the manner of torch's tensor-parallel styles.

Each style is a ``ParallelStyle`` (``plan``), applied with ``parallelize_module(module, mesh,
plan)`` to a layer by name pattern (``tp_plan`` writes the plan of a Hugging Face decoder).
``mesh`` is a ``Mesh`` or a sub-mesh (``mesh["pe"]``): a style shards along each of its
dimensions and replicates along the parent's others.

The built-in styles place parameters only: ``ColwiseParallel`` (``nn.Linear`` weight
``[out, in]`` and bias split on the output features; ``nn.Embedding`` on the hidden
dimension), ``RowwiseParallel`` (``nn.Linear`` split on the input features, bias replicated;
``nn.Embedding`` on the vocabulary: vocab-parallel), ``ReplicateParallel`` (every parameter
and buffer replicated). NOTE: torch's styles also convert their inputs' and outputs'
layouts with hooks; here an op's operands move as sharding propagation decides
(``sharding``, ``ops_matmul_mesh``), timed, so a column-parallel layer's output stays sharded
for the row-parallel one and only the row-parallel output is reduced.

A module still on the host (CPU, or meta for timing-only runs) is checked against the HBM
before any of its tensors moves (``HbmFull`` names the first tensor past it); one already on
ahbm is re-placed (untimed: a deployment, as ``distribute_tensor``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..dispatch import is_ahbm, value_of
from ..hbm import hbm_book
from ..placement.spec import Replicate, Shard, Spec, expand
from ..tensor import AhbmTensor
from .plan import ParallelStyle


def _spec(mesh, placement, shape: tuple, dims=None) -> Spec:
    if dims is not None:
        mesh = mesh[dims]
    spec = Spec(*expand(mesh, list(placement) if isinstance(placement, tuple) else [placement] * mesh.ndim))
    spec.check(shape)
    return spec


def place(module: nn.Module, placed: dict, mesh, dims=None) -> nn.Module:
    """Re-place ``module``'s own tensors (``placed``: parameter or buffer name ->
    placement along every dimension of ``mesh``, or of its dimensions ``dims``, replicated
    along the others; a tuple: one placement per such dimension), all or nothing."""
    items = [(n, getattr(module, n), _spec(mesh, p, tuple(getattr(module, n).shape), dims))
             for n, p in placed.items() if getattr(module, n, None) is not None]
    host = [(n, t, s) for n, t, s in items if not is_ahbm(t)]
    if host:
        specs = iter(s for _, _, s in host)
        # NOTE: check_fits places each tensor by a function of its shape; the specs come in order.
        hbm_book(mesh.machine).check_fits(type(module).__name__, [(n, tuple(t.shape), t.numel() * t.element_size())
                                                                  for n, t, _ in host], lambda shape: next(specs))
    for name, t, spec in items:
        value = value_of(t) if is_ahbm(t) else t.detach() if t.is_meta else t.detach().to("cpu").clone()
        new = AhbmTensor(value, spec)
        if name in module._parameters:
            module._parameters[name] = nn.Parameter(new, requires_grad=False)
        else:
            module._buffers[name] = new
    return module


def _kind(module: nn.Module, style: str) -> str:
    for cls, kind in ((nn.Linear, "linear"), (nn.Embedding, "embedding")):
        if isinstance(module, cls):
            return kind
    raise ValueError(f"{style}: expects nn.Linear or nn.Embedding, got {type(module).__name__}")


@dataclass(frozen=True)
class ColwiseParallel(ParallelStyle):
    """``nn.Linear``: weight and bias ``Shard(0)`` (output features); ``nn.Embedding``:
    ``Shard(1)``. ``dims``: the mesh dimensions to shard along (None: all of the mesh given)."""

    dims: tuple | str | None = None

    def apply(self, module: nn.Module, mesh) -> nn.Module:
        if _kind(module, "ColwiseParallel") == "embedding":
            return place(module, {"weight": Shard(1)}, mesh, self.dims)
        return place(module, {"weight": Shard(0), "bias": Shard(0)}, mesh, self.dims)


@dataclass(frozen=True)
class RowwiseParallel(ParallelStyle):
    """``nn.Linear``: weight ``Shard(1)`` (input features), bias replicated (added once, after
    the reduction); ``nn.Embedding``: ``Shard(0)`` (vocab-parallel). ``dims``: as ``ColwiseParallel``'s.
    ``inside``: a mesh dimension along which an ``nn.Linear``'s weight is ``Shard(0)``
    (output features) instead: row-parallel across the others, column-parallel inside it
    (its input gathered there, its result reduced across the others only)."""

    dims: tuple | str | None = None
    inside: str | None = None

    def apply(self, module: nn.Module, mesh) -> nn.Module:
        if _kind(module, "RowwiseParallel") == "embedding":
            return place(module, {"weight": Shard(0)}, mesh, self.dims)
        weight = Shard(1)
        if self.inside is not None:
            names = (mesh[self.dims] if self.dims is not None else mesh).names
            if self.inside not in (names or ()):
                raise KeyError(f"RowwiseParallel(inside={self.inside!r}): the mesh's dimensions are {names}")
            weight = tuple(Shard(0) if n == self.inside else Shard(1) for n in names)
        return place(module, {"weight": weight, "bias": Replicate()}, mesh, self.dims)


@dataclass(frozen=True)
class ReplicateParallel(ParallelStyle):
    """Every parameter and buffer of the module and its submodules replicated."""

    dims: tuple | str | None = None

    def apply(self, module: nn.Module, mesh) -> nn.Module:
        for sub in module.modules():
            names = [n for n, t in (*sub._parameters.items(), *sub._buffers.items()) if t is not None]
            place(sub, dict.fromkeys(names, Replicate()), mesh, self.dims)
        return module


#: Megatron-style tensor parallelism of a Hugging Face decoder, by layer name: column-parallel
#: projections (and the LM head: vocab-parallel logits), row-parallel ones after them.
COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")
ROWWISE = ("o_proj", "down_proj")


def tp_plan(model: nn.Module, mesh, tp_dim=None, inside: str | None = None) -> dict:
    """The tensor-parallel plan of an unmodified Hugging Face decoder along mesh dimension(s)
    ``tp_dim`` of ``mesh`` (None: all; along the others the weights are replicated): q/k/v,
    gate/up and the LM head ``ColwiseParallel``, o/down ``RowwiseParallel``, the embedding
    vocab-parallel (``RowwiseParallel``), norms ``ReplicateParallel``; any other layer (an
    MoE's experts, a router) keeps its placement. Layers repeated per block are one pattern
    (``model.layers.*.mlp.up_proj``). ``inside``: o/down column-parallel along that mesh
    dimension (``RowwiseParallel.inside``). For ``parallelize_module(model, mesh, plan)``."""
    dims = None if tp_dim is None else tuple([tp_dim] if isinstance(tp_dim, (str, int)) else tp_dim)
    if dims is not None:
        mesh[dims]                       # NOTE: a KeyError naming the mesh's dimensions, before any plan
    plan = {}
    for name, sub in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        pattern = ".".join("*" if part.isdigit() else part for part in name.split("."))
        if isinstance(sub, nn.Linear) and leaf in COLWISE:
            plan.setdefault(pattern, ColwiseParallel(dims))
        elif isinstance(sub, nn.Linear) and leaf in ROWWISE:
            plan.setdefault(pattern, RowwiseParallel(dims, inside))
        elif isinstance(sub, nn.Embedding):
            plan.setdefault(pattern, RowwiseParallel(dims))
        elif type(sub).__name__.endswith("Norm") and any(True for _ in sub.parameters(recurse=False)):
            plan.setdefault(pattern, ReplicateParallel(dims))
    if not any(p.rsplit(".", 1)[-1] in ROWWISE for p in plan):
        raise ValueError(f"tp_plan: {type(model).__name__} has no layer named {' or '.join(ROWWISE)}: not a "
                         f"decoder this plan knows; write the plan (parallelize_module) yourself")
    return plan
