"""``kbtorch.graphed``: every call of a function or module captured and timed as one graph,
and, timing-only, a static call replayed without running it on the host.

A call is *static* when what it reaches through its arguments (``state``: their tensors'
shapes and placements, the objects it is given by identity, and the tensors those objects
hold by identity, shape and placement) is the same after the call as before: it wrote
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


def state(args, kwargs, module=None) -> tuple | None:
    """What a call can see, hashable (see the module docstring), or None when it cannot be
    told. The arguments' own tensors count by shape, stride, dtype and placement (a decode
    step's new ids); tensors inside objects by identity too (a cache's buffers), and so do
    ``module``'s parameters and buffers."""
    out: list = []
    try:
        _walk((args, kwargs), (), DEPTH, False, out)
        if module is not None:
            for name, t in (*module.named_parameters(), *module.named_buffers()):
                _walk(t, ("module", name), 0, True, out)
    except _Unknown:
        return None
    return tuple(out)


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
    counts the calls, those simulated, re-timed and replayed without capture."""
    module = fn if isinstance(fn, torch.nn.Module) else None
    call = module.forward if module is not None else fn
    label = name or getattr(type(module), "__name__", None) or getattr(fn, "__name__", "graph")
    static: dict = {}           # state -> (graph, Outputs)

    # NOTE: ``wraps``: the wrapper keeps ``call``'s signature; Hugging Face's ``generate()``
    # reads it (a forward without ``logits_to_keep`` gets the LM head of every position).
    @functools.wraps(call)
    def wrapper(*args, **kwargs):
        before = state(args, kwargs, module) if host_replay and is_timing_only() else None
        wrapper.graphs["calls"] += 1
        if before is not None and before in static:
            g, outputs = static[before]
            g.run()
            out = outputs.make()
            wrapper.graphs["replayed"] += 1
        else:
            with Graph(name=label, **options) as g:
                out = call(*args, **kwargs)
            wrapper.graphs["retimed"] += 1 if g.retimed else 0
            if before is not None and g.kernels and not reads_host(g) and state(args, kwargs, module) == before:
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
    if module is not None:
        module.forward = wrapper
        return module
    return wrapper
