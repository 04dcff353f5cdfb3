"""``torch.compile(fn_or_module, backend="kbtorch")``: dynamo's graphs as kbtorch graphs.

The backend (found by dynamo under the name ``"kbtorch"`` through the package's entry point)
takes each FX graph dynamo captures, lowers it to aten ops (``make_fx``: the aten graph,
decomposed as dispatch decomposes, with the fused ops kbtorch runs whole, SDPA and the
norms, kept whole), and returns a function that runs that aten graph on the device inside
a ``kbtorch.graph()`` capture: every aten node goes through the one dispatch pipeline (the
same handlers as eager, the same values), and the kernels are timed as one graph
(overlap, fusion, one launch; cached, so a call with the same shapes is not simulated
again).

Graph breaks: code dynamo cannot trace runs eagerly between the compiled graphs (its ops
go on the stream one by one); ``breaks()`` lists each break dynamo reported, with its
reason and source line. A call with new shapes makes dynamo recompile: the backend says so,
naming the graph first compiled from the same code (``compiled()`` lists every graph it
compiled, with its input shapes). Shapes are static:
the backend's first call turns dynamo's automatic dynamic shapes off.
"""
from __future__ import annotations

import logging

import torch

from .capture import Graph

log = logging.getLogger(__name__)
_COMPILED: list = []
_FIRST: dict = {}           # dynamo's graph (its ops in order) -> the first graph compiled from it


def _meta(x):
    if not isinstance(x, torch.Tensor):
        return x
    shape = tuple(int(s) for s in x.shape)
    stride = tuple(int(s) for s in x.stride())
    return torch.empty_strided(shape, stride, dtype=x.dtype, device="meta")


def _aten(gm, example_inputs):
    """The aten graph of dynamo's ``gm`` (pre-dispatch: composite ops such as linear and SDPA
    stay whole, as the device runs them)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    metas = [_meta(x) for x in example_inputs]
    with torch.no_grad():
        return make_fx(gm, pre_dispatch=True)(*metas)


def backend(gm, example_inputs):
    """The ``"kbtorch"`` dynamo backend (see the module docstring)."""
    # NOTE: kernels are planned and simulated for concrete shapes: a new shape recompiles
    # (dynamo would otherwise turn a changed size into a symbolic one on the next call).
    torch._dynamo.config.automatic_dynamic_shapes = False
    aten_gm = _aten(gm, example_inputs)
    shapes = [tuple(int(s) for s in x.shape) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    number = len(_COMPILED)
    ops = sum(1 for n in aten_gm.graph.nodes if n.op == "call_function")
    # NOTE: dynamo's own graph is the traced code, the same for every shape it is called with.
    first = _FIRST.setdefault(tuple((n.op, str(n.target)) for n in gm.graph.nodes), number)
    again = first if first != number else None
    _COMPILED.append({"graph": number, "inputs": shapes, "aten_ops": ops, "recompiles": again})
    log.warning("kbtorch.tensor.graph.compile: graph %d: %d aten ops for inputs %s%s", number, ops, shapes,
                f" (recompiled: graph {again}'s code with new shapes)" if again is not None else "")

    def run(*args):
        with Graph(name=f"compiled graph {number}") as g:
            out = aten_gm(*args)
        run.graph = g
        return out

    run.graph = None
    run.aten = aten_gm
    return run


_BREAKS: list = []


class _BreakLog(logging.Handler):
    """Collects dynamo's graph-break records as ``file:line: reason`` and warns once each."""

    def emit(self, record) -> None:
        lines = record.getMessage().splitlines()
        site = lines[0].rsplit(" at ", 1)[-1] if lines else "?"
        why = next((x.split(":", 1)[1].strip() for x in lines if x.strip().startswith("Explanation:")),
                   next((x for x in lines[1:] if x.strip()), "?"))
        text = f"{site.rsplit('/', 1)[-1]}: {why}"
        if text not in _BREAKS:
            _BREAKS.append(text)
            log.warning("kbtorch.tensor.graph.compile: graph break at %s (runs eagerly)", text)


def breaks() -> list[str]:
    """The graph breaks dynamo reported in this process: ``file:line: reason``."""
    return list(_BREAKS)


def compiled() -> list[dict]:
    """Every graph the backend compiled: number, input shapes, aten ops, and ``recompiles``:
    the number of the graph compiled earlier from the same code (other shapes), or None."""
    return list(_COMPILED)


def register() -> None:
    """Register the backend with dynamo as ``"kbtorch"`` by hand (once): an installed kbtorch
    needs no call, dynamo finds it by its ``torch_dynamo_backends`` entry point (pyproject)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "kbtorch" not in _BACKENDS:
        register_backend(name="kbtorch")(backend)


def listen_for_breaks() -> None:
    """Take dynamo's graph-break records (at DEBUG, not printed again), once per process.

    NOTE: only a logger is configured here: importing dynamo itself takes ~2 s, which
    ``import kbtorch`` does not pay; dynamo loads the backend when a compile first asks for it."""
    breaks_log = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    if not any(isinstance(h, _BreakLog) for h in breaks_log.handlers):
        breaks_log.setLevel(logging.DEBUG)
        breaks_log.propagate = False
        breaks_log.addHandler(_BreakLog())
