"""``torch.compile(fn_or_module, backend="kbtorch")``: dynamo's graphs as kbtorch graphs.

The backend (found by dynamo under the name ``"kbtorch"`` through the package's entry point)
takes each FX graph dynamo captures and returns a function that runs it on the device inside
a ``kbtorch.graph()`` capture: every op goes through the one dispatch pipeline (the same
handlers as eager, the same values), and the kernels are timed as one graph (overlap,
fusion, one launch; cached, so a call with the same shapes is not simulated again).

Dynamo's fake pass (shape propagation while it traces) runs no kernels: on fake values,
dispatch computes each op's result shape on the host (``dispatch._fake_pass``). So a
graph traced with symbolic shapes (``dynamic=True``, ``torch._dynamo.mark_dynamic``) serves
every size it admits, and each call is simulated for its concrete shapes.

A graph input not on ahbm (a model left on CPU) is refused, naming the parameter. Graph
breaks: code dynamo cannot trace runs eagerly between the compiled graphs (its ops go on
the stream one by one); ``breaks()`` lists each break dynamo reported, with its reason and
source line, and dynamo never compiles kbtorch's own frames (``_never_traced``). A call with
shapes the graph does not admit makes dynamo recompile: ``compiled()`` lists every graph
compiled, with its input shapes, and the graph first compiled from the same frame (a new
function with the same ops and shapes is a new graph, not a recompile).
"""
from __future__ import annotations

import logging
import re

import torch

from ..dispatch import DEVICE
from ..tensor import AhbmTensor
from .capture import Graph
from ... import state

log = logging.getLogger(__name__)
_COMPILED: list = state.cache([], "kbtorch.tensor.graph.compile._COMPILED")
_FIRST: dict = state.cache({}, "kbtorch.tensor.graph.compile._FIRST")           # dynamo's frame id -> the first graph compiled from it


def _check_on_device(gm, example_inputs) -> None:
    """Refuse a graph whose tensor inputs (parameters, buffers, arguments) are not on ahbm,
    naming the first parameter (else the first input) that is not: it would run on the host
    and report no latency."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    wrong = []
    for i, x in enumerate(example_inputs):
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.device.type != DEVICE:
            source = getattr(places[i].meta.get("grapharg"), "source", None) if i < len(places) else None
            name = getattr(source, "name", f"input {i}")
            wrong.append((_readable(name() if callable(name) else name), x))
    if wrong:
        name, x = min(wrong, key=lambda w: not w[0].startswith("parameter"))
        raise RuntimeError(f"kbtorch backend: {name} {tuple(x.shape)} is on '{x.device}', not on '{DEVICE}': "
                           f"move the model and its inputs with .to('{DEVICE}') before calling the compiled model")


def _readable(source: str) -> str:
    """A dynamo source as the user names it: ``L['self']._modules['model']._parameters['weight']``
    -> ``parameter model.weight``; ``L['x']`` -> ``argument x``."""
    kind = next((k for k in ("parameter", "buffer") if f"._{k}s[" in source), None)
    path = re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", source)
    path = re.sub(r"^L\['(?:self|fn|mod)'\]\.|^L\['args'\]\[0\]\.", "", path)
    path = re.sub(r"^L\['([^']+)'\]", r"\1", path)
    return f"{kind or 'argument'} {path}"


def _shape(x):
    return tuple(int(s) if isinstance(s, int) else str(s) for s in x.shape) if isinstance(x, torch.Tensor) else x


def _never_traced() -> None:
    """Dynamo never compiles kbtorch's own frames: where a graph break runs code eagerly, the
    device's entries (the torch function and dispatch hooks, the PrivateUse1 kernels) and all
    they call run as plain Python. NOTE: this is the eval-frame strategy of those code
    objects only; dynamo still inlines ``__torch_function__`` while it traces user code."""
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy
    from .. import device
    skip = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    for fn in (AhbmTensor.__torch_function__, AhbmTensor.__torch_dispatch__, device._empty,
               device._empty_strided, device._copy_from):
        set_code_exec_strategy(getattr(fn, "__func__", fn).__code__, skip)


def _recompiles(number: int):
    """The graph first compiled from the frame dynamo is compiling now, or None when this is
    that frame's first compile (or outside dynamo). NOTE: dynamo's compile id names the frame
    and counts its compiles (``frame_compile_id`` 0 is the first); ``torch._dynamo.reset()``
    numbers frames from 0 again, so a first compile always takes the frame's number over."""
    from torch._guards import CompileContext
    cid = CompileContext.current_compile_id()
    if cid is None:
        return None
    if not cid.frame_compile_id or cid.frame_id not in _FIRST:
        _FIRST[cid.frame_id] = number
        return None
    return _FIRST[cid.frame_id]


def backend(gm, example_inputs):
    """The ``"kbtorch"`` dynamo backend (see the module docstring)."""
    _check_on_device(gm, example_inputs)
    shapes = [_shape(x) for x in example_inputs]
    number = len(_COMPILED)
    ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
    again = _recompiles(number)
    _COMPILED.append({"graph": number, "inputs": shapes, "ops": ops, "recompiles": again})
    log.log(logging.WARNING if again is not None else logging.INFO,
            "kbtorch.tensor.graph.compile: graph %d: %d ops for inputs %s%s", number, ops, shapes,
            f" (recompiled: graph {again}'s code with new shapes)" if again is not None else "")

    def run(*args):
        with Graph(name=f"compiled graph {number}") as g:
            out = gm(*args)
        run.graph = g
        return out

    run.graph = None
    run.gm = gm
    return run


_BREAKS: list = state.cache([], "kbtorch.tensor.graph.compile._BREAKS")


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


def __getattr__(name: str):
    """``dynamo_backend``: the backend, as dynamo's entry point loads it (pyproject), when
    ``torch.compile(..., backend="kbtorch")`` is called and before any frame is traced: the
    moment to keep dynamo off kbtorch's own frames (``_never_traced``)."""
    if name != "dynamo_backend":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _never_traced()
    return backend


def register() -> None:
    """Register the backend with dynamo as ``"kbtorch"`` by hand (once): an installed kbtorch
    needs no call, dynamo finds it by its ``torch_dynamo_backends`` entry point (pyproject)."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "kbtorch" not in _BACKENDS:
        _never_traced()
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
