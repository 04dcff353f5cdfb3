"""``AhbmTensor``: a tensor on the ``"ahbm"`` device, its numeric data and its placement.

A thin wrapper subclass (``torch.Tensor._make_wrapper_subclass``), in the manner of DTensor:
it holds ``_local`` (the numeric value as one CPU tensor, the global view) and ``_spec``
(its ``placement.Spec`` over a mesh of PEs). Numerics are computed with torch on
``_local``; timing belongs to the kernels that ops dispatch to.
"""
from __future__ import annotations

from contextlib import contextmanager
from math import prod

import torch
from torch.utils._pytree import tree_map

from .placement import Mesh, Replicate, Shard, Spec, first_split_dim, view_placements

DEVICE = "ahbm"

#: Ops that only change how the data is viewed or copy it in from the host: no kernel, no time.
#: NOTE: views (view, transpose, ...) are metadata on the PEs too as long as the layout
#: allows; a copy-in (``copy_``, ``fill_``, random init) is the host's untimed deployment.
METADATA = {
    "detach", "alias", "view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
    "slice", "select", "as_strided", "_reshape_alias",
}
HOST_WRITES = {"copy_", "zero_", "fill_", "normal_", "uniform_", "random_", "bernoulli_", "_to_copy", "to", "arange",
               "lift_fresh", "set_", "resize_"}


#: Composite ops that reach dispatch whole (in inference mode) and run as their aten
#: decomposition (``linear`` -> ``t`` + ``addmm``/``mm``, ``matmul`` -> ``mm``/``bmm``).
DECOMPOSE = {"linear", "matmul", "reshape", "flatten", "contiguous"}

_TIMING_ONLY = [False]


@contextmanager
def timing_only():
    """Inside this block new ahbm tensors hold no data (a meta tensor inside): ops still run
    their kernels on the simulator, so full-size models fit in memory; asking for values
    (``.cpu()``) raises."""
    old = _TIMING_ONLY[0]
    _TIMING_ONLY[0] = True
    try:
        yield
    finally:
        _TIMING_ONLY[0] = old


def is_timing_only() -> bool:
    return _TIMING_ONLY[0]


#: Elements per PE below which a new tensor is replicated rather than sharded.
SHARD_MIN_PER_PE = 1024


def default_spec(n_pes: int, shape: tuple = ()) -> Spec:
    """Where a new ahbm tensor goes: over a flat mesh of every PE, sharded along its first
    dimension of at least ``n_pes`` rows if it is large (at least ``SHARD_MIN_PER_PE``
    elements per PE: weights, long activations), else replicated (biases, norms' weights,
    a decode step's activations)."""
    mesh = Mesh(tuple(range(n_pes)), (n_pes,))
    d = first_split_dim(tuple(shape), n_pes) if prod(shape) >= n_pes * SHARD_MIN_PER_PE else None
    return Spec(mesh, (Shard(d),) if d is not None else (Replicate(),))


class AhbmTensor(torch.Tensor):
    """A tensor on ``ahbm``: ``_local`` (CPU value) and ``_spec`` (placement)."""

    _local: torch.Tensor
    _spec: Spec

    @staticmethod
    def __new__(cls, local: torch.Tensor, spec: Spec, requires_grad: bool = False, owns: bool = True):
        """``owns``: the tensor has a buffer of its own in HBM (not a view), which must fit."""
        r = torch.Tensor._make_wrapper_subclass(cls, local.shape, strides=local.stride(), dtype=local.dtype,
                                                device=torch.device(DEVICE, 0), requires_grad=requires_grad)
        r._local, r._spec = local, spec
        if owns:
            from .device import hbm_book
            hbm_book().reserve(r, spec, tuple(local.shape), local.numel() * local.element_size())
        return r

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"AhbmTensor({self._local!r}, device='{DEVICE}:0', placements={list(self._spec.placements)})"

    def __tensor_flatten__(self):
        return ["_local"], self._spec

    @staticmethod
    def __tensor_unflatten__(inner: dict, spec, outer_size, outer_stride):
        return AhbmTensor(inner["_local"], spec, owns=False)

    @property
    def placements(self) -> tuple:
        return self._spec.placements

    def redistribute(self, placements) -> "AhbmTensor":
        """This tensor with new placements; the collective it needs is timed."""
        from .redistribute import redistribute
        return redistribute(self, placements)

    def full_tensor(self) -> torch.Tensor:
        from .redistribute import full_tensor
        return full_tensor(self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """Catch ops that must arrive whole (SDPA); everything else goes on to dispatch."""
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            from .ops_attention import sdpa
            return sdpa(args, kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        """Order: (1) a copy to another device returns a plain tensor there; (2) an op with
        a registered handler (``dispatch.HANDLERS``) runs its tile kernel; (3) a composite op
        of ``DECOMPOSE`` runs as its decomposition; (4) metadata ops and host writes run on
        the local value, untimed; (5) anything else raises NotImplementedError naming the op."""
        from .dispatch import HANDLERS
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name.endswith("_") and isinstance(args[0], AhbmTensor):
            root(args[0]).__dict__.pop("_replicated", None)
        if name in ("_to_copy", "to") and kwargs.get("device") is not None \
                and torch.device(kwargs["device"]).type != DEVICE:
            if args[0]._local.is_meta:
                raise RuntimeError(f"kbtorch: this ahbm tensor {tuple(args[0].shape)} was made in timing-only mode "
                                   f"and holds no data; its values are not available")
            return func(args[0]._local, *args[1:], **kwargs)
        if name in HANDLERS:
            return HANDLERS[name](func, args, kwargs)
        if name in DECOMPOSE:
            out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if name in METADATA or name in HOST_WRITES:
            found = [a for a in (*args, *kwargs.values()) if isinstance(a, AhbmTensor)]
            spec = found[0]._spec
            out = func(*tree_map(local, args), **tree_map(local, _host_kwargs(kwargs)))
            if isinstance(kwargs.get("out"), AhbmTensor):
                return kwargs["out"]
            if name.endswith("_") and isinstance(args[0], AhbmTensor):
                return args[0]
            owns = name not in METADATA
            base = found[0]

            def place(x):
                if not isinstance(x, torch.Tensor):
                    return x
                placed = spec
                if name in METADATA:
                    placed = Spec(spec.mesh, view_placements(spec.placements, name, args, tuple(base.shape),
                                                             tuple(x.shape)))
                view = AhbmTensor(x, placed, owns=owns)
                if not owns:
                    view._root = root(base)
                return view
            return tree_map(place, out)
        raise NotImplementedError(f"kbtorch: {func} on ahbm tensors is not supported yet "
                                  f"(no tile kernel is registered for it)")


def root(x: AhbmTensor) -> AhbmTensor:
    """The tensor owning the buffer a view looks at (itself if it is no view).

    NOTE: a root remembers (``_replicated``) that its data was made replicated on its mesh,
    so that a second view of the same data needs no second all-gather; any in-place op on
    it or its views forgets it."""
    return getattr(x, "_root", x)


def local(x):
    """The numeric value of an ahbm tensor (anything else passes through)."""
    return x._local if isinstance(x, AhbmTensor) else x


def _host_kwargs(kwargs: dict) -> dict:
    if "device" in kwargs:
        kwargs = dict(kwargs, device=torch.device("cpu"))
    return kwargs
