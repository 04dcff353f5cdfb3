"""The one dispatch pipeline of the ahbm device and its handler registry.

Handlers are registered by decorator on aten overloads or overload packets, in the manner
of DTensor (``@register(aten.mm.default)``, ``@register(aten.add, aten.add_)``). A handler
``fn(func, args, kwargs, machine)`` computes the value with torch on the host values (the
numeric pass), redistributes its inputs as the placements require and runs its tile kernels
on the simulator (the timing pass); it returns an ``Out``. The dispatcher does the rest:
records the kernels, wraps the values into ``AhbmTensor``s (booking HBM) placed as told.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_flatten, tree_map

from ..kernel.door import paused_gc
from .placement.spec import Spec, default_spec
from .stream import CAPTURE, record_run

DEVICE = "ahbm"
HANDLERS: dict = {}
#: The numeric pass of ops whose value is not torch's CPU kernel's on the host values (the
#: kernel lacks a dtype: ``histc`` of integers): packet -> ``fn(func, args, kwargs)``, used
#: by their handler and by dynamo's fake pass alike.
HOST_VALUES: dict = {}



@dataclass(frozen=True)
class Out:
    """A handler's result: ``value`` (a host tensor or a pytree of them); ``where`` it lies
    (a ``Spec``, or None: placed by default for its shape); the kernels it ran (``runs``,
    ``kernels.Timed``, recorded in order); ``view_of``: the ahbm tensor whose buffer the
    result looks at (a view: no HBM of its own)."""

    value: object
    where: Spec | None = None
    runs: tuple = ()
    view_of: object = None


def register(*ops):
    """Register the decorated handler for aten overloads or overload packets ``ops``."""
    def wrap(fn):
        for op in ops:
            if op in HANDLERS:
                raise ValueError(f"aten op '{op}' has two handlers")
            HANDLERS[op] = fn
        return fn
    return wrap


def is_ahbm(x) -> bool:
    return isinstance(x, torch.Tensor) and hasattr(x, "_spec")


def value_of(x):
    """The numeric value of an ahbm tensor: its global value as one host tensor (anything
    else passes through).

    A plain tensor on ahbm is a fake tensor (dynamo's fake pass made it with a factory op,
    ``torch.arange(..., device="ahbm")``): its value is a fake host tensor of the same shape."""
    if is_ahbm(x):
        return x._value
    if isinstance(x, torch.Tensor) and x.device.type == DEVICE:
        return _fake_on_host(x)
    return x


def _fake_on_host(x):
    mode = getattr(x, "fake_mode", None)
    if mode is None:
        raise RuntimeError(f"kbtorch: a plain {type(x).__name__} on '{DEVICE}' {tuple(x.shape)} {x.dtype} has no "
                           f"value (only kbtorch's own tensors live on '{DEVICE}')")
    with mode:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")


def root(x):
    """The tensor owning the buffer a view looks at (itself if it is no view).

    NOTE: a root remembers (``_replicated``) that its data was made replicated on its mesh,
    so that a second view of the same data needs no second all-gather; any in-place op on
    it or its views forgets it."""
    return getattr(x, "_root", x)


_SERIAL = itertools.count()


def uid(x) -> int:
    """A number of ``x``'s own, never reused, that keys the capture's tables.

    NOTE: not ``id``: a buffer that died mid-capture (a temporary an op read, a gathered
    copy) would hand its id, and with it its writers, readers and gathers, to whatever
    object took its address next. With a number of its own, nothing need be held: a buffer
    dies (its HBM freed) at its last use, as in eager, and not at the end of the capture."""
    d = x.__dict__
    if "_uid" not in d:
        d["_uid"] = next(_SERIAL)
    return d["_uid"]


def leaves(x) -> list:
    """The leaves of ``x`` (``tree_flatten``'s), with a fast path for the usual flat tuple,
    list or dict of tensors and scalars. NOTE: pytree costs about 10 us a call, several
    calls an op."""
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (tuple, list)) else None
    if items is not None and not any(isinstance(i, (tuple, list, dict)) for i in items):
        return list(items)
    return tree_flatten(x)[0]


def map_leaves(fn, x):
    """``tree_map(fn, x)``, with the fast path of ``leaves``."""
    if isinstance(x, tuple) and not any(isinstance(i, (tuple, list, dict)) for i in x):
        return tuple(fn(i) for i in x)
    if isinstance(x, dict) and not any(isinstance(i, (tuple, list, dict)) for i in x.values()):
        return {k: fn(v) for k, v in x.items()}
    return tree_map(fn, x)


def machine_of(op, args, kwargs):
    """The machine of an op's ahbm tensors; a mix of two machines, or of tensors on two sets
    of PEs (nothing would time moving one to the other), is an error naming both."""
    found, pes = {}, {}
    for a in leaves(args) + leaves(kwargs):
        if is_ahbm(a):
            found.setdefault(a._spec.mesh.machine, None)
            pes.setdefault(frozenset(a._spec.mesh.pes), a._spec.mesh)
    if len(found) > 1:
        a, b = list(found)[:2]
        raise RuntimeError(f"kbtorch: {op} mixes ahbm tensors of two machines, '{a.name}' and '{b.name}' "
                           f"(move them to one machine first)")
    if len(pes) > 1:
        a, b = (_pe_text(m.pes) for m in list(pes.values())[:2])
        raise RuntimeError(f"kbtorch: {op} mixes ahbm tensors on two sets of PEs ({a} and {b}); place them on one "
                           f"mesh first, so that the move is timed")
    return next(iter(found), None)


def _pe_text(pes) -> str:
    pes = sorted(pes)
    return f"PEs {pes[0]}-{pes[-1]}" if pes == list(range(pes[0], pes[-1] + 1)) else f"PEs {pes}"


def same_device(op: str, args) -> None:
    """torch's error for a mix of ahbm and cpu tensors (a 0-dim cpu tensor is a scalar, as
    in torch: allowed with any device)."""
    devices = {("ahbm" if is_ahbm(a) else a.device.type) for a in leaves(args)
               if isinstance(a, torch.Tensor) and (is_ahbm(a) or a.dim() > 0)}
    if len(devices) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{' and '.join(sorted(devices))}! (when checking arguments of {op})")


def dispatch(cls, func, args, kwargs):
    """Run aten op ``func`` on ahbm tensors of type ``cls``. Order:

    1. the op's machine: the one of its ahbm tensors (two machines: RuntimeError naming
       both); an in-place op (name ending ``_``) makes its target forget it was replicated;
    2. the handler: registered for the overload (``aten.mm.default``), else for its packet
       (``aten.mm``). SDPA arrives here as ``aten.scaled_dot_product_attention.default``
       from ``AhbmTensor.__torch_function__``, which only forwards to this function (torch
       would otherwise lower it by backend before dispatch sees it);
       An ``out=`` overload without a handler of its own runs its functional overload,
       the result written into ``out`` (``_out_variant``); values that are fake tensors
       (dynamo's fake pass) get their result's shape only, no kernels (``_fake_pass``);
    3. no handler: a composite op (one with a CompositeImplicitAutograd kernel, e.g.
       ``linear``, ``matmul``, ``reshape``, ``chunk``, ``layer_norm`` reaching dispatch
       whole in inference mode) runs as its aten decomposition (each part dispatched
       again), a ``torch.library.custom_op`` runs its Python body; anything else raises
       NotImplementedError naming the op;
    4. the handler runs with the cyclic garbage collector paused (``paused_gc``: its kernel
       builds make many small acyclic objects, 14% of Llama-3-70B's prefill in collections);
    5. the handler's ``Out``: its kernels are recorded on the stream in order (inputs it
       redistributed were recorded as they ran, before), and its values wrapped as ``cls``
       on the op's machine, placed by ``where`` (default: by shape), booking HBM unless
       they are views (a value already on ahbm, as an in-place op's target, stays). Anything else a handler returns (an in-place op's target, a tensor
       copied off the device) is returned as it is."""
    graph = CAPTURE.get()
    if graph is not None and not graph.depth:
        return graph.op(cls, func, args, kwargs)       # graph capture (tensor.graph): a node
    name = func.overloadpacket.__name__
    machine = machine_of(func, args, kwargs)
    if name.endswith("_") and is_ahbm(args[0]):
        root(args[0]).__dict__.pop("_replicated", None)
    if is_ahbm(kwargs.get("out")) and func not in HANDLERS and _functional(func) is not None:
        return _out_variant(cls, func, args, kwargs)
    handler = HANDLERS.get(func) or HANDLERS.get(func.overloadpacket)
    if _fake(args, kwargs):
        return _fake_pass(cls, func, args, kwargs, machine)
    if handler is None:
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
        body = _custom_op_body(func)
        if body is not None:
            return body(*args, **kwargs)
        raise NotImplementedError(f"kbtorch: {func} on ahbm tensors is not supported yet "
                                  f"(no tile kernel is registered for it)")
    with paused_gc():
        out = handler(func, args, kwargs, machine)
    if not isinstance(out, Out):
        return out
    for run in out.runs:
        record_run(machine, run)
    if isinstance(out.value, torch.Tensor):
        return _wrap(cls, out.value, out, machine)
    return tree_map(lambda v: _wrap(cls, v, out, machine), out.value)


def _fake(args, kwargs) -> bool:
    """Whether an op's values are fake tensors: dynamo's fake pass (torch.compile) is tracing.

    NOTE: on every op: the first ahbm tensor tells (one op never mixes fake and real values)."""
    first = next((x for x in leaves(args) if is_ahbm(x)), None)
    if first is None:
        first = next((x for x in leaves(kwargs) if is_ahbm(x)), None)
    return first is not None and isinstance(first._value, FakeTensor)


def _fake_pass(cls, func, args, kwargs, machine):
    """An op in dynamo's fake pass: its result's shape, dtype and aliasing, no kernels (the
    compiled graph runs and is timed on real values, per concrete shape). A result that is an
    input's value (an in-place op's target) is that input; any other is a new ahbm tensor
    placed by default, booking no HBM."""
    out = HOST_VALUES.get(func.overloadpacket, host_call)(func, args, kwargs)
    inputs = {id(x._value): x for x in leaves(args) + leaves(kwargs) if is_ahbm(x)}

    def wrap(v):
        if not isinstance(v, torch.Tensor):
            return v
        same = inputs.get(id(v))
        return same if same is not None else cls(v, default_spec(machine, tuple(v.shape)), owns=False)
    return map_leaves(wrap, out)


def _functional(func):
    """The functional overload of an ``out=`` overload with one output (``mm.out`` ->
    ``mm.default``: the same arguments but ``out``), or None."""
    schema = getattr(func, "_schema", None)
    if schema is None or [a.name for a in schema.arguments if a.is_out] != ["out"]:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments if not a.is_out]
    packet = func.overloadpacket
    for name in packet.overloads():
        other = getattr(packet, name)
        if not other._schema.is_mutable and [(a.name, str(a.type)) for a in other._schema.arguments] == wanted:
            return other
    return None


def _out_variant(cls, func, args, kwargs):
    """``op.out(..., out=t)``: the functional op (its handler, its kernels), its result
    written into ``t``'s buffer as its kernels would have written it (no copy is timed).
    A result of another shape or dtype than ``t`` is refused, as torch refuses to resize a
    view; ``t`` keeps its placement."""
    out = kwargs["out"]
    result = dispatch(cls, _functional(func), args, {k: v for k, v in kwargs.items() if k != "out"})
    if tuple(result.shape) != tuple(out.shape) or result.dtype != out.dtype:
        raise RuntimeError(f"kbtorch: {func}: the result {tuple(result.shape)} {result.dtype} does not fit out= "
                           f"{tuple(out.shape)} {out.dtype} (ahbm tensors are not resized)")
    value_of(out).copy_(value_of(result))
    return out


def _custom_op_body(func):
    """The Python body of a ``torch.library.custom_op`` (a model's own op, as transformers'
    ``grouped_mm_fallback``), or None: run on ahbm tensors, its ops are dispatched one by one,
    as its CPU kernel runs them on the host."""
    from torch._library.custom_ops import OPDEFS
    opdef = OPDEFS.get(func._schema.name) if hasattr(func, "_schema") else None
    return getattr(opdef, "_init_fn", None)


def host_call(func, args, kwargs):
    """The op on the host values (the numeric pass), in place where the op is.

    NOTE: timing-only: when a value is a meta tensor, host tensors join it on meta; an
    integer or bool result computed on meta is materialised as zeros on the host, so that
    the small index tensors a program branches on (token ids, positions, masks, a stopping
    criterion) keep values and ``generate()`` runs to its length."""
    a, k = map_leaves(value_of, tuple(args)), map_leaves(value_of, kwargs)
    meta = any(isinstance(x, torch.Tensor) and x.is_meta for x in leaves(a) + leaves(k))
    if "device" in k:
        k = dict(k, device=torch.device("meta" if meta else "cpu"))
    if not meta:
        return func(*a, **k)
    a, k = tree_map(_to_meta, (a, k))
    key = _meta_key(func, a, k)
    if key is None:
        return tree_map(_materialise, func(*a, **k))
    if key not in META_RESULTS:
        if len(META_RESULTS) >= META_RESULTS_MAX:
            META_RESULTS.clear()
        META_RESULTS[key] = func(*a, **k)
    return tree_map(lambda x: _materialise(_fresh(x)), META_RESULTS[key])


#: host_call's results on meta tensors: (op, its arguments with each tensor as its shape,
#: strides, offset and dtype) -> the op's meta result. NOTE: torch computes a meta result
#: through its Python references, 1-12 ms an op (a decode step of Llama-3-70B calls it
#: about 2400 times with about 50 distinct keys). Only ops that neither write nor alias
#: are kept (their schema says so; ``PURE`` lists the Python functions known to be such):
#: a meta result then depends on nothing else, and every call gets tensors of its own.
META_RESULTS: dict = {}
META_RESULTS_MAX = 4096
PURE = (torch.nn.functional.scaled_dot_product_attention,)


def _meta_key(func, args, kwargs):
    """``META_RESULTS``' key of a call on meta tensors, or None when it is not to be kept."""
    schema = getattr(func, "_schema", None)
    if schema is None and func not in PURE:
        return None
    if schema is not None and (schema.is_mutable or any(r.alias_info is not None for r in schema.returns)):
        return None
    try:
        return func, _arg_key(args), _arg_key(kwargs)
    except TypeError:
        return None


def _arg_key(x):
    """A hashable, type-exact description of an argument (TypeError for anything else)."""
    if isinstance(x, torch.Tensor):
        if not x.is_meta or x.is_conj() or x.is_neg():
            raise TypeError("not a plain meta tensor")
        return "T", tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.requires_grad
    if isinstance(x, (tuple, list)):
        return type(x), tuple(_arg_key(i) for i in x)
    if isinstance(x, dict):
        return dict, tuple((k, _arg_key(v)) for k, v in x.items())
    if x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device, torch.memory_format,
                                   torch.layout)):
        return type(x), x
    raise TypeError(f"{type(x).__name__} is not described")


def _fresh(x):
    """A new meta tensor like ``x`` (each call's result is its own object)."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta",
                                   requires_grad=x.requires_grad)
    return x


def _to_meta(x):
    return x.to("meta") if isinstance(x, torch.Tensor) else x


def _materialise(x):
    if isinstance(x, torch.Tensor) and x.is_meta and not (x.is_floating_point() or x.is_complex()):
        return torch.zeros(x.shape, dtype=x.dtype)
    return x


def refuse(func, kwargs, names=("out",)) -> None:
    """NotImplementedError naming a keyword argument the handler does not honour."""
    for name in names:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"kbtorch: {func} with '{name}=' on ahbm tensors is not supported")


def _wrap(cls, value, out: Out, machine):
    if not isinstance(value, torch.Tensor) or is_ahbm(value):
        return value
    spec = out.where or default_spec(machine, tuple(value.shape))
    wrapped = cls(value, spec, owns=out.view_of is None)
    if out.view_of is not None:
        wrapped._root = root(out.view_of)
    return wrapped
