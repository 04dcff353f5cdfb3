"""Pointwise ops on the ahbm device (unary, binary, ternary; comparisons, logical ops,
``where``, ``clamp``, ``masked_fill``, activations, trig): one vector MATH kernel family
(``kbtorch.ops.vector``).

Each aten op maps to a cost CLASS (``CLASSES``); the MATH work per element of a class is
the machine's (``flops_per_element`` of the math component in the topology file, e.g.
``cmp``, ``select``, ``transcendental``): no cost lives here. Numerics: the torch op on the
host values (broadcasting, type promotion and every keyword argument as torch has them;
``out=`` is refused). Timing: one pass with one input per ahbm tensor argument over each
PE's part of the output (its shard, or all of it when the result is replicated);
placements follow ``sharding.elementwise_inputs``. Integer and bool tensors run at the
machine's fp32 rate with their own element size (``kernels.kernel_dtype``).
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

from ..dispatch import Out, host_call, is_ahbm, refuse, register, same_device
from ..placement.sharding import elementwise_inputs, placement
from ..timing import kernel_dtype, mesh_of, on, timed, vector

aten = torch.ops.aten


def _classes(cls: str, names: str) -> dict:
    return {name: cls for name in names.split()}


#: aten op -> cost class (a name of the machine's ``flops_per_element`` table).
# NOTE: ``neg`` is a multiply by -1, ``abs`` a max with the negation, ``pow`` the square
# that LLM code uses it for (a general power costs more).
CLASSES = {
    **_classes("add", "add sub rsub"),
    **_classes("mul", "mul neg pow square"),
    **_classes("div", "div reciprocal remainder fmod floor_divide"),
    **_classes("max", "maximum minimum fmax fmin abs clamp clamp_min clamp_max relu hardtanh sign sgn "
                      "leaky_relu threshold"),
    **_classes("cmp", "eq ne lt le gt ge isnan isinf isneginf isposinf logical_not logical_and logical_or "
                      "logical_xor bitwise_and bitwise_or bitwise_xor bitwise_not isin"),
    **_classes("select", "where masked_fill nan_to_num"),
    **_classes("round", "floor ceil round trunc frac"),
    **_classes("fma", "addcmul addcdiv lerp"),
    **_classes("exp", "exp exp2 expm1"),
    **_classes("transcendental", "log log2 log10 log1p sin cos tan tanh sigmoid erf erfinv atan asin acos "
                                 "sinh cosh atan2 softplus elu hardsigmoid hardswish mish xlogy"),
    **_classes("sqrt", "sqrt"),
    **_classes("rsqrt", "rsqrt"),
    **_classes("silu", "silu"),
    **_classes("gelu", "gelu"),
    **_classes("polar", "polar"),
}
#: the work of one complex element, in ops of its cost class (per real part: a complex add
#: is two adds, a multiply four multiplies and two adds); a cost class not listed is
#: refused on complex tensors. ``polar`` (|r| cos t + i |r| sin t) is a class of its own:
#: two transcendentals and two multiplies per element.
COMPLEX_WORK = {"add": 2, "mul": 6, "select": 2}
#: cost class -> (the machine's classes it is made of, times each), for composite classes.
COMPOSITE_CLASSES = {"polar": (("transcendental", 2), ("mul", 2))}
IN_PLACE = tuple(f"{name}_" for name in CLASSES if hasattr(aten, f"{name}_"))


@register(*(getattr(aten, name) for name in (*CLASSES, *IN_PLACE)))
def pointwise(func, args, kwargs, machine):
    """Out-of-place ops return a new tensor; in-place ones (``add_``) update ``args[0]``."""
    name = func.overloadpacket.__name__
    refuse(func, kwargs)
    same_device(name, (args, kwargs))
    out = host_call(func, args, kwargs)
    target = out if not name.endswith("_") else args[0]
    tensors = [a for a in tree_flatten((args, kwargs))[0] if is_ahbm(a)]
    placed, run = pointwise_run(machine, name, CLASSES[name.rstrip("_")], tensors, target)
    runs = (run,) if run is not None else ()
    if name.endswith("_"):
        return Out(args[0], runs=runs)
    return Out(out, on(tensors[0], placed), runs=runs)


def pointwise_run(machine, name: str, cls: str, tensors: list, out: torch.Tensor):
    """The vector pass of a pointwise op of cost class ``cls`` writing ``out`` from the
    ahbm ``tensors`` (their inputs made compatible first, see ``sharding``): -> (result
    placement, ``Timed`` or None for an empty result). Elements are as wide as the widest
    operand, the output's bytes scaled to its own width."""
    if name.endswith("_"):
        placed = placement(tensors[0])
    else:
        tensors, placed = elementwise_inputs(tensors, tuple(out.shape))
    if not out.numel():
        return placed, None
    dtype, eb = kernel_dtype(out, name, complex_ok=True)
    work = _work(machine, name, cls, out)
    widest = max((t for t in tensors if t.numel()), key=lambda t: t.element_size(), default=None)
    if widest is not None and widest.element_size() > eb:
        eb = widest.element_size()
        if not out.is_floating_point():
            dtype = kernel_dtype(widest, name, complex_ok=True)[0]
    run = vector(machine, cls, out.numel(), placed=placed, pes=mesh_of(tensors[0]), shape=tuple(out.shape),
                 inputs=len(tensors) or 1, dtype=dtype, elem_bytes=eb, out_ratio=out.element_size() / eb,
                 flops_per_element=work if out.is_complex() or cls in COMPOSITE_CLASSES else None)
    return placed, timed(f"aten::{name}", tensors, f"elementwise {cls}", run, work * out.numel())


def _work(machine, name: str, cls: str, out: torch.Tensor) -> int:
    """MATH work per output element: the machine's for ``cls`` (``COMPOSITE_CLASSES``: the sum
    of its parts), times ``COMPLEX_WORK`` for a complex result."""
    parts = COMPOSITE_CLASSES.get(cls, ((cls, 1),))
    work = sum(machine.math_flops(c) * times for c, times in parts)
    if out.is_complex() and cls not in COMPOSITE_CLASSES:
        if cls not in COMPLEX_WORK:
            raise NotImplementedError(f"kbtorch: {name} on complex ahbm tensors is not supported (complex "
                                      f"{', '.join(COMPLEX_WORK)} ops only)")
        work *= COMPLEX_WORK[cls]
    return work
