"""``kbtorch.graphed``: every call of a function or module captured and timed as one graph,
and, timing-only, a static call replayed without running it on the host.

A call is *static* when what it reaches through its arguments (``state``: their tensors'
shapes and placements, the objects it is given by identity, and the tensors those objects
hold by identity, shape and placement; the module's weights and Python attributes, and the
closure and globals the function's code reads) is the same after the call as before: it wrote
tensors only in place (decode with Hugging Face's ``StaticCache``, whose generate loop
hands the forward fixed-shape inputs). In timing-only mode (``kbtorch.timing_only``) its
tensors hold no data, so a later call in the same state, with the same module weights,
computes nothing the program can observe that the first did not: its outputs are new
tensors of the captured ones' shapes and placements (or the very objects it passed
through), and its timing is the graph's. That call is replayed as a CUDA graph is, with
no host work: the graph's cached timing goes on the stream as one launch, no op is
dispatched. A device tensor's values are not part of the state (a decode step's position
moves every step): a call that reads values back to the host (``reads_host``: ``.item()``,
a copy off the device), where control flow could hang on them, is captured every time, as
are calls with data and calls whose state changes (``DynamicCache`` appends to its tensors).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..dispatch import is_ahbm, root
from ..handlers.meta import QUERIES, leaves_device
from ..tensor import AhbmTensor, is_timing_only
from .capture import Graph, Slot

#: How deep ``state`` looks into the attributes of the objects a call is given (a KV cache:
#: the cache, its layers, their tensors).
DEPTH = 3
#: Host tensors of up to this many elements are part of a call's state by value; a larger
#: one makes the call not replayable (its values could steer the program).
HOST_ELEMS = 4096
#: Static calls kept per wrapper (state -> graph and outputs); the oldest is dropped beyond.
STATIC_MAX = 8
_PLAIN = (type(None), bool, int, float, complex, str, torch.dtype, torch.device)


class _Unknown(Exception):
    """A call that cannot be replayed: a host tensor too large to compare or not on the CPU, or
    an output passed through from its own arguments."""


def state(args, kwargs, module=None, fn=None) -> tuple | None:
    """What a call can see, hashable (see the module docstring), or None when it cannot be
    told. The arguments' own tensors count by shape, stride, dtype and placement (a decode
    step's new ids); tensors inside objects by identity too (a cache's buffers), and so do
    ``module``'s parameters and buffers, the Python attributes of it and its submodules (a
    flag that flips a branch), and what ``fn`` reads from outside: its closure's cells and
    the globals its code names (a weight it closes over, grown or replaced)."""
    out: list = []
    try:
        _walk((args, kwargs), (), DEPTH, False, out)
        if module is not None:
            for name, t in (*module.named_parameters(), *module.named_buffers()):
                _walk(t, ("module", name), 0, True, out)
            for name, sub in module.named_modules():
                for k, v in vars(sub).items():
                    if k not in _MODULE_TABLES:
                        _walk(v, ("attribute", f"{name}.{k}".lstrip(".")), 0, True, out)
        for name, v in _outside(fn):
            _walk(v, ("closure", name), 0, True, out)
    except _Unknown:
        return None
    return tuple(out)


#: A module's own tables (its parameters, buffers, submodules and hooks: walked apart or not state).
_MODULE_TABLES = frozenset(("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set")) | frozenset(
    k for k in vars(torch.nn.Module()) if k.endswith("hooks") or k.startswith("_state_dict") or k.startswith("_load"))


def _outside(fn) -> list:
    """(name, value) of what ``fn``'s code reads from outside: its closure's cells and the
    globals (not modules nor functions) its code names."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    cells = [(n, c.cell_contents) for n, c in zip(code.co_freevars, fn.__closure__ or ()) if _filled(c)]
    names = fn.__globals__ if hasattr(fn, "__globals__") else {}
    found = [(n, names[n]) for n in code.co_names if n in names]
    return [(n, v) for n, v in cells + found if not callable(v) or isinstance(v, torch.nn.Module)
            if not isinstance(v, type(functools))]


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def why(old: tuple, new: tuple) -> str:
    """What differs between two states, as the user names it (the first entry that does)."""
    for a, b in zip(old, new):
        if a != b:
            return f"{_named(a[0])} changed"
    return "what the call reaches changed" if len(old) == len(new) else "the call's arguments changed"


def _named(path: tuple) -> str:
    if path and path[0] in ("attribute", "closure", "module"):
        kind = {"attribute": "module attribute", "closure": "closure/global", "module": "module tensor"}[path[0]]
        return f"{kind} {path[1]!r}"
    if len(path) < 2:
        return "the arguments"
    return f"argument {str(path[1]).strip(chr(39))}" + "".join(f"[{p}]" for p in path[2:])


def _walk(x, path: tuple, depth: int, held: bool, out: list) -> None:
    if isinstance(x, torch.Tensor):
        if is_ahbm(x):
            ident = (id(x), id(root(x))) if held else None
            out.append((path, "ahbm", ident, tuple(x.shape), x.stride(), x.dtype, x._spec))
        elif x.device.type == "cpu" and x.numel() <= HOST_ELEMS:
            out.append((path, "host", tuple(x.shape), x.dtype, tuple(x.flatten().tolist())))
        else:
            raise _Unknown
    elif isinstance(x, _PLAIN):
        out.append((path, x))
    elif isinstance(x, (list, tuple)):
        out.append((path, type(x), len(x)))
        for i, v in enumerate(x):
            _walk(v, path + (i,), depth, held, out)
    elif isinstance(x, dict):
        out.append((path, type(x), tuple(map(repr, x))))
        for k, v in x.items():
            _walk(v, path + (repr(k),), depth, held, out)
    else:
        out.append((path, "object", id(x)))
        if depth and not isinstance(x, torch.nn.Module) and hasattr(x, "__dict__"):
            for k, v in vars(x).items():
                _walk(v, path + (k,), depth - 1, True, out)


def reads_host(g: Graph) -> bool:
    """Whether a node of ``g`` read values back to the host (``.item()``, ``torch.equal``, a
    copy off the device): its control flow may hang on them, so it is captured every call."""
    for node in g.nodes:
        name = node.func.overloadpacket.__name__
        if name in QUERIES or leaves_device(node.func, node.kwargs) \
                or (name == "copy_" and not isinstance(node.args[0], Slot) and not is_ahbm(node.args[0])):
            return True
    return False


@dataclass(frozen=True)
class _Fresh:
    """A new tensor of a replayed call's outputs."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    spec: object


class Outputs:
    """What a static call returned, as a template: its pytree, its non-tensor leaves (the
    same objects again: the state holds them by identity), the tensors it passed through from
    inside the objects it was given (the same again), and new tensors' shapes, strides, dtypes
    and placements. A tensor of the call's own arguments passed through (which the next call
    gives anew) makes it not replayable."""

    def __init__(self, out, args, kwargs, seen: tuple):
        leaves, self.spec = tree_flatten(out)
        given = {id(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        held = {entry[2][0] for entry in seen if entry[1] == "ahbm" and entry[2] is not None}
        self.leaves = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and id(leaf) not in held:
                if id(leaf) in given or not is_ahbm(leaf):
                    raise _Unknown
                leaf = _Fresh(tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf._spec)
            self.leaves.append(leaf)

    def make(self):
        """New outputs: fresh tensors (no data, HBM booked as any new tensor's), the rest as returned."""
        return tree_unflatten([AhbmTensor(torch.empty_strided(x.shape, x.stride, dtype=x.dtype, device="meta"), x.spec)
                               if isinstance(x, _Fresh) else x for x in self.leaves], self.spec)


def graphed(fn, *, name: str | None = None, host_replay: bool = True, **options):
    """``fn`` (a function or an ``nn.Module``) with every call captured and timed as one graph
    (``Graph``; ``options`` are its): the values are eager's, the timing is the graph's,
    cached by what it ran, so a call with the shapes of an earlier one is not simulated again
    (decode with a static KV cache: one graph a step, simulated once). Timing-only, a call in
    the state of an earlier static one is replayed without host work (``host_replay``, see
    the module docstring). A module gets the wrapper as its ``forward``; ``wrapper.graphs``
    counts the calls, those simulated, re-timed and replayed without capture.

    Replay is safe: a call replays only when everything its graph read is unchanged: its
    arguments' shapes, the module's weights and Python attributes (``self.wide = True``
    flips a branch), and what the function reads from outside (its closure and globals: a
    weight that grew or was replaced). On a change the call is captured again, and
    ``wrapper.recaptures`` says why (``"module attribute 'wide' changed"``). NOTE: what a
    helper function called from ``fn`` reads from its own globals is not guarded."""
    module = fn if isinstance(fn, torch.nn.Module) else None
    call = module.forward if module is not None else fn
    label = name or getattr(type(module), "__name__", None) or getattr(fn, "__name__", "graph")
    static: dict = {}           # state -> (graph, Outputs)

    # NOTE: ``wraps``: the wrapper keeps ``call``'s signature; Hugging Face's ``generate()``
    # reads it (a forward without ``logits_to_keep`` gets the LM head of every position).
    @functools.wraps(call)
    def wrapper(*args, **kwargs):
        before = state(args, kwargs, module, call) if host_replay and is_timing_only() else None
        wrapper.graphs["calls"] += 1
        if before is not None and before in static:
            g, outputs = static[before]
            g.run()
            out = outputs.make()
            wrapper.graphs["replayed"] += 1
        else:
            if before is not None and static:
                wrapper.recaptures.append(why(next(reversed(static)), before))
            with Graph(name=label, **options) as g:
                out = call(*args, **kwargs)
            wrapper.graphs["retimed"] += 1 if g.retimed else 0
            if before is not None and g.kernels and not reads_host(g) \
                    and state(args, kwargs, module, call) == before:
                try:
                    static[before] = (g, Outputs(out, args, kwargs, before))
                except _Unknown:
                    pass
                while len(static) > STATIC_MAX:
                    del static[next(iter(static))]
        wrapper.graphs["simulated"] += 0 if g.cached or g.retimed else 1
        wrapper.last = g
        return out

    wrapper.graphs, wrapper.last = {"calls": 0, "simulated": 0, "retimed": 0, "replayed": 0}, None
    wrapper.recaptures = []
    if module is not None:
        module.forward = wrapper
        return module
    return wrapper
