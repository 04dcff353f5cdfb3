"""Pipeline parallelism across chip groups, on an unmodified Hugging Face causal LM.

``pipeline_parallel(model, mesh, stages, microbatches)`` finds the decoder layers by
structure (the longest ``nn.ModuleList`` of one class), splits them into ``stages``
contiguous groups (as even as possible, the first stages taking one more) and gives group
``s`` the PEs of chips ``[s C/p, (s+1) C/p)`` of the (chips x PEs) ``mesh``: its layers'
weights live there (placed as ``default_spec`` places over those PEs), the modules before
the layers (the embedding, the rotary table) on the first stage, those after (the final
norm, the LM head) on the last; a weight keeps the placement it had (``place_tp``'s
column/row-parallel linears: tensor parallel over the stage's PEs). While a stage runs, new tensors and unplaced kernels use
its PEs (``placement.SCOPE``) and its ops go on its own trace track (``stream.TRACK``).

A call of the model splits the batch into ``microbatches`` (``torch.chunk`` of the rows)
and runs them one after another through the stages, as GPipe's forward does. Every stage
is a stream of its own: a stage starts micro-batch ``j`` when it has finished ``j - 1``
and the activations of ``j`` have arrived from the stage before (the send: a timed
transfer over the system network, ``pp send s->s+1``, on its own track); the call ends
when the last stage finishes the last micro-batch. With ``m`` micro-batches of stage time
``t`` on ``p`` stages the call takes about ``(m + p - 1) t``: the bubbles are the idle
spans of each stage's track in the trace.

Modeling choices:
- a tensor moves to a stage's PEs as a transfer from its first chip to the stage's first
  chip, through ``LINES`` PE pairs (``broadcast`` of two members each, all at once), its
  whole size if it is replicated, a chip's share if sharded; a tensor replicated over PEs
  that include the stage's is already there (no transfer);
- the inputs of a call start on the first stage, its logits go back to the first stage's
  chip (where the next step's tokens enter) as one transfer per micro-batch, and the
  micro-batches' logits are joined into one tensor without a kernel (each stays where it
  was made);
- each micro-batch keeps a KV cache of its own (``MicroCaches``); a static cache is refused;
- stages share no PE; their only shared resource is the network, and each transfer is
  simulated alone (two transfers at the same time do not slow each other down).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from .. import stream
from ..dispatch import is_ahbm, leaves, map_leaves, value_of
from ..placement.mesh import Mesh, chip_mesh, chip_rows, chips_of
from ..placement.spec import SCOPE, Partial, Replicate, Spec, default_spec
from ..tensor import AhbmTensor
from ..timing import kernel_dtype
from .plan import ParallelStyle, describe, parallelize_module
from .transfer import line_bytes, lines_ns as _transfer, pair_lines
from ... import state



def decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """``(name, layers)``: the longest ``nn.ModuleList`` of ``model`` whose entries are all of
    one class (ValueError if none has two)."""
    best = None
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) >= 2 and len({type(x) for x in m}) == 1:
            if best is None or len(m) > len(best[1]):
                best = (name, m)
    if best is None:
        raise ValueError(f"pipeline_parallel: {type(model).__name__} has no list of decoder layers "
                         f"(an nn.ModuleList of at least 2 modules of one class)")
    return best


def split_layers(n: int, stages: int) -> list[range]:
    """``n`` layers in ``stages`` contiguous groups, as even as possible (first ones larger)."""
    bounds = [s * (n // stages) + min(s, n % stages) for s in range(stages + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def pipeline_parallel(model: torch.nn.Module, mesh: Mesh | None = None, stages: int = 2,
                      microbatches: int = 1) -> torch.nn.Module:
    """Pipeline ``model`` (on ahbm) over ``stages`` chip groups of ``mesh`` (default: every
    chip of the current machine) with ``microbatches`` per call; -> ``model``, in place."""
    return parallelize_module(model, mesh or chip_mesh(), PipelineParallel(stages, microbatches))


@dataclass(frozen=True)
class PipelineParallel(ParallelStyle):
    """The pipeline-parallel plan (module docstring), applied to a whole model."""

    stages: int = 2
    microbatches: int = 1

    def apply(self, model: torch.nn.Module, mesh: Mesh) -> torch.nn.Module:
        stages, microbatches = self.stages, self.microbatches
        rows = chip_rows(mesh, "pipeline_parallel")
        if stages < 1 or len(rows) % stages:
            raise ValueError(f"pipeline_parallel: {stages} stages do not split the mesh's {len(rows)} chips evenly")
        if microbatches < 1:
            raise ValueError(f"pipeline_parallel: microbatches must be positive, got {microbatches}")
        if "pipeline" in getattr(model, "parallel_plan", {}):
            raise ValueError(f"pipeline_parallel: {type(model).__name__} is already pipelined "
                             f"({model.parallel_plan['pipeline']})")
        name, layers = decoder_layers(model)
        if len(layers) < stages:
            raise ValueError(f"pipeline_parallel: {len(layers)} decoder layers ('{name}') cannot fill {stages} stages")
        per = len(rows) // stages
        meshes = [Mesh(tuple(p for r in rows[s * per:(s + 1) * per] for p in r), (per * len(rows[0]),),
                       mesh.machine) for s in range(stages)]
        groups = split_layers(len(layers), stages)
        pipe = Pipeline(meshes, microbatches, rows)
        for module, s in _stage_of_modules(model, layers, groups).items():
            _place(module, meshes[s])
            module.register_forward_pre_hook(pipe.hook(s), with_kwargs=True)
        pipe.wrap(model)
        describe(model, "pipeline", f"PP {stages}: {len(layers)} layers as {[len(g) for g in groups]} on {per} "
                                    f"chip(s) per stage, {microbatches} micro-batch(es) per call")
        return model


def _stage_of_modules(model, layers, groups) -> dict:
    """Every module holding parameters or buffers of its own -> its stage."""
    stage_of_layer = {id(layers[i]): s for s, g in enumerate(groups) for i in g}
    inside = {}
    for layer in layers:
        for m in layer.modules():
            inside[id(m)] = stage_of_layer[id(layer)]
    out, seen_layers, last = {}, False, len(groups) - 1
    for m in model.modules():
        if m is layers:
            seen_layers = True
        own = list(m.parameters(recurse=False)) + list(m.buffers(recurse=False))
        if id(m) in inside:
            out[m] = inside[id(m)]
        elif own:
            out[m] = 0 if not seen_layers or not list(m.parameters(recurse=False)) else last
    for layer in layers:
        out.setdefault(layer, stage_of_layer[id(layer)])
    return out


def _place(module, mesh: Mesh) -> None:
    """The module's own parameters and buffers on ``mesh`` (untimed deployment): a tensor
    placed on a 1-D mesh keeps its placement (a column- or row-parallel weight stays one,
    now over the stage's PEs: tensor parallel inside the stage), any other as
    ``default_spec`` places it over the stage's PEs."""
    token = SCOPE.set(mesh)
    try:
        for store in (module._parameters, module._buffers):
            for key, t in store.items():
                if t is None or (is_ahbm(t) and tuple(t._spec.mesh.pes) == mesh.pes):
                    continue
                value = value_of(t) if is_ahbm(t) else t.detach().clone()
                keep = is_ahbm(t) and len(t._spec.placements) == 1 and not isinstance(t._spec.placements[0], Partial)
                spec = Spec(mesh, t._spec.placements) if keep else default_spec(mesh.machine, tuple(value.shape))
                store[key] = None
                new = AhbmTensor(value, spec)
                store[key] = torch.nn.Parameter(new, requires_grad=False) if isinstance(t, torch.nn.Parameter) \
                    else new
    finally:
        SCOPE.reset(token)


class Pipeline:
    """The stages' streams and the transfers between them (module docstring)."""

    def __init__(self, meshes: list, microbatches: int, rows: list):
        self.meshes, self.microbatches = meshes, microbatches
        per = len(rows) // len(meshes)
        self.chips = [rows[s * per:(s + 1) * per] for s in range(len(meshes))]
        self.stage = None           # the stage running now (None: outside a micro-batch)
        self.free = [0.0] * len(meshes)
        self.moved: dict = {}       # id(tensor) -> (tensor, its copy on the running stage)
        self.calling = False        # inside a call of the pipelined model

    def hook(self, s: int):
        """The forward pre-hook of a module of stage ``s``: a new stage takes over (``enter``);
        the inputs not on the stage's PEs move there."""
        def pre(module, args, kwargs):
            if not self.calling:
                raise RuntimeError(f"pipeline_parallel: {type(module).__name__} of stage {s} called outside the "
                                   f"pipelined model's forward (call the model itself)")
            if s == self.stage:
                return self._here_all(args, kwargs)
            if self.stage is not None:
                self.free[self.stage] = stream.clock_ns()
            self.stage, self.moved = s, {}
            SCOPE.set(self.meshes[s])
            stream.TRACK.set("pp sends")
            self.arrive(leaves(args) + [x for v in kwargs.values() for x in leaves(v)], s)
            args, kwargs = self._here_all(args, kwargs)
            stream.set_clock_ns(max(self.free[s], stream.clock_ns()))
            stream.TRACK.set(f"pp stage {s}")
            return args, kwargs
        return pre

    def _here_all(self, args, kwargs):
        return map_leaves(self._here, tuple(args)), {k: map_leaves(self._here, v) for k, v in kwargs.items()}

    def _here(self, x):
        """``x`` on the running stage's PEs (moved there, timed, if it is not)."""
        if not is_ahbm(x) or tuple(x._spec.mesh.pes) == self.meshes[self.stage].pes:
            return x
        if id(x) not in self.moved:
            self.moved[id(x)] = (x, self.move(x, self.stage))
        return self.moved[id(x)][1]

    def arrive(self, tensors: list, s: int) -> None:
        """What stage ``s`` needs from elsewhere arrives: one transfer (from the previous
        stage's end) of all of ``tensors`` that are not there yet, packed in one buffer."""
        away = {id(x): x for x in tensors if is_ahbm(x) and not self._there(x, s)}
        if not away:
            return
        for x in away.values():
            self.moved[id(x)] = (x, self.move(x, s, timed=False))
        first = next(iter(away.values()))
        self.send(list(away.values()), first._spec.mesh, self.chips[s], f"stage {s}")

    def _there(self, x, s: int) -> bool:
        """Whether ``x`` needs no transfer to stage ``s`` (on its PEs, or replicated over PEs
        including them)."""
        mesh, src = self.meshes[s], x._spec.mesh
        return tuple(src.pes) == mesh.pes or (all(isinstance(p, Replicate) for p in x._spec.placements)
                                              and set(mesh.pes) <= set(src.pes))

    def move(self, x, s: int, timed: bool = True):
        """``x`` on stage ``s``'s PEs: free if it is there (``_there``), else a transfer
        from its chips to the stage's (module docstring; ``timed=False``: recorded by the
        caller)."""
        mesh = self.meshes[s]
        src = x._spec.mesh
        if self._there(x, s):
            return AhbmTensor(value_of(x), Spec(mesh, (Replicate(),)), owns=False)
        if timed:
            self.send([x], src, self.chips[s], f"stage {s}")
        token = SCOPE.set(mesh)
        try:
            return AhbmTensor(value_of(x), default_spec(mesh.machine, tuple(x.shape)))
        finally:
            SCOPE.reset(token)

    def send(self, xs: list, src: Mesh, dsts: list, where: str) -> None:
        """Record the transfer of the tensors ``xs`` (in one buffer) from the chips of ``src``
        to the chips ``dsts``: chip to chip in pairs, ``LINES`` PE pairs each, all at once."""
        owner = {p: c for c, pes in enumerate(chips_of(src.machine)) for p in pes}
        mine = {owner[p] for p in src.pes}
        srcs = [r for group in self.chips for r in group if owner[r[0]] in mine] or [tuple(src.pes)]
        pairs = [(a, b) for a, b in (list(zip(srcs, dsts)) or [(srcs[0], dsts[0])]) if owner[a[0]] != owner[b[0]]]
        if not pairs:
            return                  # NOTE: already on those chips (one stage: the logits stay)
        x = xs[0]
        sharded = not all(isinstance(p, Replicate) for p in x._spec.placements)
        name, eb = kernel_dtype(value_of(x), "pipeline send")
        total = sum(t.numel() * value_of(t).element_size() for t in xs)
        lines, k = pair_lines(pairs)
        per_line = line_bytes(-(-total // len(srcs)) if sharded else total, k)
        latency, algo, obtained = _transfer(src.machine, lines, per_line, name if eb == 2 else "fp32")
        chips = sorted(mine), sorted(owner[r[0]] for r in dsts)
        stream.record(f"pp send -> {where}", tuple(tuple(t.shape) for t in xs), f"broadcast {algo} x{len(lines)}",
                      latency,
                      bytes=per_line * len(lines), detail=f"chips {chips[0]} -> {chips[1]}, {total} bytes",
                      track="pp sends", obtained=obtained)


    # -- a call: micro-batches through the stages ------------------------------------------------
    def wrap(self, model) -> None:
        """``model.forward`` runs its batch as micro-batches (module docstring)."""
        inner = model.forward

        def forward(*args, **kwargs):
            return self.call(inner, args, kwargs)
        model.forward = forward

    def call(self, inner, args, kwargs):
        if len(args) > 1 or any(kwargs.get(k) is not None and kwargs.get(k) is not False
                                for k in ("labels", "output_hidden_states", "output_attentions")):
            raise NotImplementedError("pipeline_parallel: a call with more than input_ids positionally, labels= or "
                                      "output_hidden_states/attentions= is not supported yet")
        kwargs = dict(kwargs, **({"input_ids": args[0]} if args else {}))
        key = "past_key_values" if "past_key_values" in kwargs else "cache"
        cache = kwargs.pop(key, None)
        lead = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        batch, m = lead.shape[0], self.microbatches
        if batch < m:
            raise ValueError(f"pipeline_parallel: a batch of {batch} cannot make {m} micro-batches")
        parts = _caches(cache, m)
        bounds = [(j * (-(-batch // m)), min(batch, (j + 1) * (-(-batch // m)))) for j in range(m)]
        t0, outer, ends, outs = stream.clock_ns(), (SCOPE.get(), stream.TRACK.get()), [], []
        self.calling = True
        try:
            for j, (a, b) in enumerate(bounds):
                stream.set_clock_ns(t0)
                self.stage = None
                kw = {k: self._rows(v, a, b, batch) for k, v in kwargs.items()}
                out = inner(**kw, **{key: parts[j]})
                self.free[self.stage] = stream.clock_ns()
                stream.TRACK.set("pp sends")
                head = _head(out)
                self.send([out[head]], out[head]._spec.mesh, self.chips[0], f"stage 0 ({head})")
                ends.append(stream.clock_ns())
                outs.append(out)
        finally:
            SCOPE.set(outer[0])
            stream.TRACK.set(outer[1])
            self.stage, self.calling, self.moved = None, False, {}
        stream.set_clock_ns(max(ends + self.free))
        return _joined(outs, parts, key)

    def _rows(self, v, a: int, b: int, batch: int):
        """Rows ``a:b`` of a batch input on the first stage (other inputs as they are)."""
        if not isinstance(v, torch.Tensor) or not v.dim() or v.shape[0] != batch:
            return v
        if not is_ahbm(v):
            return v[a:b]
        first = self.meshes[0]
        if all(isinstance(p, Replicate) for p in v._spec.placements) and set(first.pes) <= set(v._spec.mesh.pes):
            return AhbmTensor(value_of(v)[a:b], Spec(first, (Replicate(),)), owns=False)
        raise NotImplementedError(f"pipeline_parallel: an input of shape {tuple(v.shape)} placed as "
                                  f"{list(v._spec.placements)} (not replicated over the first stage)")


def _caches(cache, m: int) -> list:
    """A KV cache per micro-batch: the ones a ``MicroCaches`` holds, fresh copies of an empty
    cache, or None each."""
    if cache is None:
        return [None] * m
    parts = getattr(cache, "micro_parts", None)
    if parts is not None:
        if len(parts) != m:
            raise ValueError(f"pipeline_parallel: a cache of {len(parts)} micro-batches for {m}")
        return parts
    if type(cache).__name__ != "DynamicCache" or cache.get_seq_length():
        raise NotImplementedError(f"pipeline_parallel: a {type(cache).__name__} (filled or static) is not supported; "
                                  f"use the default DynamicCache")
    return [copy.deepcopy(cache) for _ in range(m)]


def _joined(outs: list, parts: list, key: str):
    """The micro-batches' outputs as one: their logits joined (no kernel: each micro-batch's
    stays where it was made), their caches as one ``MicroCaches``."""
    head = _head(outs[0])
    value = torch.cat([value_of(o[head]) for o in outs])
    out = outs[0]
    out[head] = AhbmTensor(value, default_spec(out[head].machine, tuple(value.shape)))
    caches = [o.get(key) if key in o else o.get("past_key_values") for o in outs]
    if caches[0] is not None:
        out[key if key in out else "past_key_values"] = micro_caches(caches)
    return out


def _head(out) -> str:
    """The output a model call hands on: its logits (a causal LM) or last hidden state."""
    return "logits" if out.get("logits") is not None else "last_hidden_state"


def micro_caches(parts: list):
    """A ``DynamicCache`` standing for one KV cache per micro-batch (``micro_parts``), for
    ``generate()`` to hand back: its length is the parts'."""
    from transformers.cache_utils import DynamicCache

    class MicroCaches(DynamicCache):
        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.micro_parts[0].get_seq_length(layer_idx)

    cache = MicroCaches()
    cache.micro_parts = list(parts)
    return cache
