"""Shared helpers of the op handlers: dtypes, the vector kernel and timed runs (which the
dispatcher records on the stream, ``stream.record_run``).

Every kernel runs on the machine of the op's tensors (passed in); caches are keyed on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..kernel import by_fidelity
from ..kernel.api import build
from ..ops.contract import dtype_of
from ..ops.vector import elementwise, elementwise_kernel
from .placement.mesh import Mesh, holders
from .placement.spec import Partial, Shard, Spec, scoped_pes
from .. import state


@dataclass(frozen=True)
class Timed:
    """One kernel an op ran (recorded on the stream by the dispatcher, in order)."""

    name: str
    shapes: tuple
    kernel: str
    result: object
    flops: int
    detail: str = ""
    rows: "Rows | None" = None      # how it splits along its rows (graph mode's overlap), if it does
    groups: tuple = ()              # a collective's PE groups (graph mode's shared copies)


@dataclass(frozen=True)
class Rows:
    """A kernel that splits along its rows (``tensor.overlap``): ``count`` rows (a GEMM's M,
    the leading dimensions of a collective's tensor); ``run(r)`` -> the ``RunResult`` of the
    same kernel on ``r`` of them, through its own op family (cached); ``kind`` what it is
    ("gemm" or the collective's kind)."""

    kind: str
    count: int
    run: Callable


def timed(name: str, args, kernel: str, result, flops: int, detail: str = "", rows: Rows | None = None) -> Timed:
    shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
    return Timed(name, shapes, kernel, result, flops, detail, rows)


def vector(machine, op: str, numel: int, *, placed=None, pes=None, shape=None, inputs: int = 2, dtype: str = "f16",
           elem_bytes: int = 2, flops_per_element: int | None = None, out_ratio: float = 1.0):
    """The vector MATH kernel (``ops.elementwise``) for a result of ``numel`` elements on
    ``pes`` (PE ids, or the ``Mesh`` of the op's tensor; default: all, or the scope's:
    ``placement.SCOPE``): split over the PEs that hold a part when ``placed`` is a ``Shard``
    (at most ``shape[dim]`` of them: on a mesh, ``placement.holders``), else all of it on
    every PE (replicated: redundant work, no communication)."""
    mesh = pes if isinstance(pes, Mesh) else None
    if mesh is not None:
        pes = mesh.pes
    pes = tuple((scoped_pes(machine) or range(len(machine.pes))) if pes is None else pes)
    n = numel if isinstance(placed, Shard) else numel * len(pes)
    copies = 1 if isinstance(placed, (Shard, Partial)) else len(pes)     # NOTE: partial sums differ per PE
    if isinstance(placed, Shard) and shape:
        size = shape[placed.dim % len(shape)]
        pes = holders(mesh, size) if mesh else pes[:max(1, min(len(pes), size))]
    return _vector(machine, op, max(1, n), pes, inputs, dtype, elem_bytes, flops_per_element, out_ratio, copies)


@state.cache


@by_fidelity(1024)
def _vector(machine, op, n, pes, inputs, dtype, elem_bytes, flops_per_element, out_ratio, copies):
    # NOTE: cached: the simulator is deterministic, so a layer repeated 28 times is simulated once.
    run = elementwise(op, n, inputs=inputs, dtype=dtype, elem_bytes=elem_bytes, machine=machine, pes=pes,
                      flops_per_element=flops_per_element, out_ratio=out_ratio, mode="auto")
    # NOTE: what graph-mode fusion (``tensor.fusion``) and shared copies (``tensor.shared``) need.
    run.result.vector = VectorPass(op, n, pes, inputs, dtype, elem_bytes, run.flops // n, out_ratio, copies)
    return run.result


@dataclass(frozen=True)
class VectorPass:
    """The parameters of a vector MATH kernel (``vector``): ``n`` elements over ``pes``
    (all of them on every PE when replicated), ``inputs`` operand streams of
    ``elem_bytes`` each, ``flops`` per element, ``out_ratio`` output elements per element;
    ``copies``: how many PEs each compute the whole (replicated), else 1."""

    op: str
    n: int
    pes: tuple
    inputs: int
    dtype: str
    elem_bytes: int
    flops: int
    out_ratio: float
    copies: int = 1

    def programs(self, machine, n: int | None = None, name: str = "") -> dict:
        """``{pe: [commands]}`` of this pass over its PEs (of ``n`` elements instead, if given)."""
        return build(elementwise_kernel, list(self.pes), machine, self.op, self.n if n is None else n, self.inputs,
                     self.elem_bytes, self.dtype, self.flops, self.out_ratio, name=name or self.op)


def mesh_of(x) -> Mesh | None:
    """The mesh of an ahbm tensor (None for anything else)."""
    spec = getattr(x, "_spec", None)
    return spec.mesh if spec is not None else None


def on(like, placement) -> Spec:
    """``placement`` along every dimension of the mesh of the ahbm tensor ``like`` (on a
    mesh of several dimensions: the same over its PEs in order as on the flat mesh)."""
    return Spec(like._spec.mesh, (placement,) * len(like._spec.placements))


#: Integer and bool types: small vector work (token ids, positions, masks).
INTEGERS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def kernel_dtype(t: torch.Tensor, op: str, complex_ok: bool = False) -> tuple[str, int]:
    """(rate name, bytes per element) of a tensor's dtype for the kernels: f16, bf16, fp32;
    integer, bool and float64 tensors, and complex ones where the op counts their work
    (``complex_ok``: elementwise ops, ``pointwise.COMPLEX_WORK``), run at the machine's fp32
    rate with their own element size.

    NOTE: the machine has no integer rates; an int64 add costs what an fp32 add does per
    element (the MATH engine's fp32 rate), and moves its 8 bytes per element."""
    if t.dtype in INTEGERS or t.dtype == torch.float64 or complex_ok and t.is_complex():
        return "fp32", t.element_size()
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise NotImplementedError(f"kbtorch: {op} on ahbm tensors of dtype {t.dtype} is not supported "
                                  f"(f16, bf16, fp32, float64, int64, int32, int16, int8, uint8, bool"
                                  f"{'; complex64, complex128 in elementwise ops' if t.is_complex() else ''})")
    d = dtype_of(t.dtype, op)
    return d.name, d.bytes
