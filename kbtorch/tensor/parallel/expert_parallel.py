"""Expert parallelism across the chips of a system, on an unmodified Hugging Face MoE model.

``expert_parallel(model, mesh)`` finds the experts of every MoE block by structure (a module
with 3-D parameters ``gate_up_proj[E, 2I, H]`` and ``down_proj[E, H, I]``, called as
``experts(hidden[T, H], top_k_index[T, k], top_k_weights[T, k])``: Mixtral, Qwen3-MoE,
OLMoE, DeepSeek-V3 in transformers 5.x), places expert ``e`` on chip ``e mod C`` of the
(chips x PEs) ``mesh`` and runs each experts call as expert parallelism does:

1. dispatch: an all-to-all across the chips sends every routed (token, expert) pair's
   hidden row from the chip that owns the token to the chip of its expert;
2. experts: on every chip, one after another for each of its experts that received rows,
   the gate/up GEMM (``m x 2I x H``, each PE of the chip its slice of 2I: the weight is
   sharded over the chip's PEs), the activation and the product on the MATH engines, and
   the down GEMM (``m x H x I``, each PE its slice of I: partial sums); all chips at once in
   ONE simulation (``scheduler.simulate``): an expert without rows runs nothing, so it
   reads no weight bytes;
3. the partial sums of the down GEMMs are all-reduced inside every chip (all chips at once);
4. combine: the all-to-all back, then each token's k rows weighted and summed (``fma``).

Each step is its own op on the stream (``ep dispatch``, ``ep experts``, ``ep reduce``,
``ep combine``, ``ep weighted sum``); ``ep experts`` has one part per expert GEMM with its
chip and rows, on its own trace lane.

Modeling choices:
- the tokens of a call are owned by the chips in order (``torch.chunk`` of the rows: each
  chip dispatches its share), as in data-parallel attention feeding expert parallelism;
- the all-to-all is padded: every (source, destination) block is the largest one, as a
  fixed-capacity dispatch buffer is; its rows of a chip move through ``LINES`` of its PEs
  (``across:chip:K``: a chip's network is driven by a few DMA engines);
- the router (its GEMM, softmax, top-k) runs before, as the model's own ops;
- numerics: the experts module's own forward on the host values (what CPU computes);
- timing-only (no values): the routed pairs spread evenly over the experts, pair ``j`` to
  expert ``j mod E`` (a balanced router), as ``ops_moe`` does for meta offsets.
"""
from __future__ import annotations

import copy

import torch

from ...kernel import by_fidelity
from ...ops.collective.side_by_side import on_groups_run
from .. import stream
from ..dispatch import is_ahbm, value_of
from ..graph.join import simulate
from ..handlers.matmul import _gemm
from ..placement.mesh import Mesh, chip_mesh, chip_rows
from ..placement.spec import Shard, Spec, default_spec
from ..redistribute import padded
from ..stream import CAPTURE, tracing
from ..tensor import AhbmTensor
from ..timing import Timed, kernel_dtype, vector
from .plan import ParallelStyle, describe, parallelize_module
from ... import state

#: PEs of each chip that drive its network in the all-to-alls (``across:chip:K``).
# NOTE: a front-end choice of which engines move the data, not hardware.
LINES = 4


def expert_modules(model: torch.nn.Module) -> list:
    """``(name, module)`` of every experts module of ``model`` (module docstring)."""
    out = []
    for name, m in model.named_modules():
        a, b = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
        if isinstance(a, torch.nn.Parameter) and isinstance(b, torch.nn.Parameter) and a.dim() == b.dim() == 3:
            out.append((name, m))
    return out


def expert_parallel(model: torch.nn.Module, mesh: Mesh | None = None) -> torch.nn.Module:
    """Expert parallelism for every MoE block of ``model`` over ``mesh`` (chips x PEs;
    default: every chip of the current machine); -> ``model``, changed in place."""
    return parallelize_module(model, mesh or chip_mesh(), ExpertParallel())


class ExpertParallel(ParallelStyle):
    """The expert-parallel plan (module docstring), applied to a whole model."""

    def apply(self, model: torch.nn.Module, mesh: Mesh) -> torch.nn.Module:
        rows = chip_rows(mesh, "expert_parallel")
        if len(rows) < 2:
            raise ValueError(f"expert_parallel: mesh {mesh.shape} on topology '{mesh.machine.name}' has "
                             f"{len(rows)} chip; expert parallelism spreads the experts over at least 2 chips "
                             f"(kbtorch.chip_mesh() on a system)")
        found = expert_modules(model)
        if not found:
            raise ValueError(f"expert_parallel: {type(model).__name__} has no experts module (a module with 3-D "
                             f"parameters gate_up_proj[E, 2I, H] and down_proj[E, H, I])")
        for name, m in found:
            _check(name, m)
            if isinstance(m.__dict__.get("forward"), _ExpertParallel):
                raise ValueError(f"expert_parallel: experts '{name}' are already expert parallel")
        for name, m in found:
            twin = copy.copy(m)
            twin._parameters = dict(m._parameters)
            _place(m, mesh)
            m.forward = _ExpertParallel(m, twin, rows, name)
        describe(model, "expert", f"EP {len(rows)}: {len(found)} MoE blocks, expert e on chip e mod {len(rows)}, "
                                  f"sharded over its {len(rows[0])} PEs; dispatch/combine all-to-all across chips")
        return model


def _check(name: str, m) -> None:
    e, i2, h = m.gate_up_proj.shape
    if tuple(m.down_proj.shape) != (e, h, i2 // 2) or getattr(m, "is_transposed", False) or \
            getattr(m, "has_bias", False) or not getattr(m, "has_gate", True):
        raise NotImplementedError(f"expert_parallel: experts '{name}' ({type(m).__name__}) with gate_up_proj "
                                  f"{tuple(m.gate_up_proj.shape)} and down_proj {tuple(m.down_proj.shape)} is "
                                  f"not the [E, 2I, H] / [E, H, I] gated layout without bias")


def _place(m, mesh: Mesh) -> None:
    """The expert weights on ``mesh``: experts over the chips, each weight's output rows
    (gate/up) or input columns (down) over a chip's PEs (untimed deployment).

    NOTE: the spec books E/C experts per chip (HBM per PE); which ones is the EP map
    (``e mod C``): the same bytes on every chip."""
    for pname, place in (("gate_up_proj", (Shard(0), Shard(1))), ("down_proj", (Shard(0), Shard(2)))):
        p = m._parameters[pname]
        value = value_of(p) if is_ahbm(p) else p.detach().clone()
        m._parameters[pname] = None
        new = AhbmTensor(value, Spec(mesh, place))
        m._parameters[pname] = torch.nn.Parameter(new, requires_grad=False)


class _ExpertParallel:
    """The experts module's forward under expert parallelism (module docstring)."""

    def __init__(self, module, twin, rows: list, name: str):
        self.module, self.twin, self.rows, self.name = module, twin, rows, name

    def __call__(self, hidden, top_k_index, top_k_weights):
        if CAPTURE.get() is not None:
            raise NotImplementedError(f"expert_parallel: experts '{self.name}' inside kbtorch.graph() capture is "
                                      f"not supported yet (run it eagerly)")
        if not is_ahbm(hidden):
            raise RuntimeError(f"expert_parallel: experts '{self.name}' got a {hidden.device} tensor; move the "
                               f"model and its inputs to 'ahbm'")
        machine = hidden.machine
        h = value_of(hidden)
        params = {n: value_of(p) for n, p in self.module.named_parameters()}
        if h.is_meta:
            out = torch.empty(h.shape, dtype=h.dtype, device="meta")
        else:
            out = torch.func.functional_call(self.twin, params, (h, value_of(top_k_index), value_of(top_k_weights)))
        e, i2, hd = self.module.gate_up_proj.shape
        counts = route_counts(value_of(top_k_index), h.is_meta, len(self.rows), e)
        dtype, eb = kernel_dtype(h, "expert_parallel")
        act = type(getattr(self.module, "act_fn", None)).__name__.lower()
        if not tracing():
            record_ep(machine, tuple(self.rows), counts, hd, i2 // 2, dtype, eb,
                      "gelu" if "gelu" in act else "silu", tuple(top_k_index.shape))
        return AhbmTensor(out, default_spec(machine, tuple(out.shape)))


def route_counts(index: torch.Tensor, meta: bool, chips: int, experts: int) -> tuple:
    """``counts[c][e]``: the (token, expert) pairs chip ``c`` owns (its ``torch.chunk`` of
    the rows) that go to expert ``e``; indices outside 0..E-1 are no expert (skipped)."""
    t, k = index.shape
    if meta:
        index = (torch.arange(t * k) % experts).reshape(t, k)
    counts = [[0] * experts for _ in range(chips)]
    per = -(-t // chips) if t else 1
    for row, experts_of in enumerate(index.tolist()):
        for ex in experts_of:
            if 0 <= ex < experts:
                counts[row // per][ex] += 1
    return tuple(tuple(c) for c in counts)


def record_ep(machine, rows: tuple, counts: tuple, h: int, i: int, dtype: str, eb: int, act: str,
              shape: tuple) -> None:
    """Put the EP steps of one experts call on the stream (module docstring)."""
    c = len(rows)
    per_expert = [sum(col) for col in zip(*counts)]
    block = max((sum(counts[s][ex] for ex in range(len(per_expert)) if ex % c == d)
                 for s in range(c) for d in range(c)), default=0)
    shapes = (shape,)
    a2a = _all_to_all(machine, rows, block * h * eb, dtype, eb) if block else None
    if a2a:
        stream.record("ep dispatch (all_to_all)", shapes, f"all_to_all {a2a[1]} x{len(_lines(rows))}", a2a[0],
                      bytes=a2a[3], detail=f"{c} chips, {block} rows per block, {_summary(counts)}",
                      obtained=a2a[2].obtained)
    sched = _experts(machine, rows, tuple(per_expert), h, i, dtype, eb, act)
    if sched is not None:
        result, parts, flops = sched
        nbytes, neck, use = stream.summary(machine, result)
        stream.record("ep experts", shapes, "grouped gemm on chips", result.latency_ns, flops=flops, bytes=nbytes,
                      bottleneck=neck, usage=use, detail=f"{sum(1 for m in per_expert if m)} of "
                      f"{len(per_expert)} experts routed: {_summary(counts)}", parts=parts,
                      obtained=result.obtained)
        red = _chip_reduce(machine, rows, max(per_expert) * h * eb, dtype, eb)
        if red:
            stream.record("ep reduce (all_reduce in chips)", shapes, f"all_reduce {red[1]} x{c}", red[0],
                          bytes=red[3], detail=f"down GEMM partial sums, {len(rows[0])} PEs per chip",
                          obtained=red[2].obtained)
    if a2a:
        stream.record("ep combine (all_to_all)", shapes, f"all_to_all {a2a[1]} x{len(_lines(rows))}", a2a[0],
                      bytes=a2a[3], detail=f"{c} chips, {block} rows per block", obtained=a2a[2].obtained)
    pairs = sum(per_expert)
    if pairs:
        all_pes = tuple(p for r in rows for p in r)
        run = vector(machine, "fma", pairs * h, placed=Shard(0), pes=all_pes, shape=(pairs * h,), dtype=dtype,
                     elem_bytes=eb)
        stream.record_run(machine, Timed("ep weighted sum", shapes, "elementwise fma", run,
                                          machine.math_flops("fma") * pairs * h))


def _summary(counts: tuple) -> str:
    per_expert = [sum(col) for col in zip(*counts)]
    return " ".join(f"e{e}:{m}" for e, m in enumerate(per_expert) if m)


def _lines(rows: tuple) -> list:
    """The all-to-all's lines: PE ``t * P // K`` of every chip forms line ``t``."""
    p = len(rows[0])
    k = min(LINES, p)
    return [tuple(r[t * p // k] for r in rows) for t in range(k)]


@state.cache


@by_fidelity(256)
def _all_to_all(machine, rows: tuple, block_bytes: int, dtype: str, eb: int) -> tuple:
    """(latency ns, algorithm, RunResult, bytes) of the padded all-to-all of ``block_bytes``
    per (source, destination) chip pair, split over the lines."""
    lines = _lines(rows)
    c = len(rows)
    per_line = -(-block_bytes // (len(lines) * eb)) * eb
    latency, algo, result = on_groups_run("all_to_all", lines, nbytes=per_line * c, dtype=dtype, machine=machine)
    return latency, algo, result, per_line * c * c * len(lines)


@state.cache


@by_fidelity(256)
def _chip_reduce(machine, rows: tuple, nbytes: int, dtype: str, eb: int):
    """The all-reduce of ``nbytes`` inside every chip at once (None on one-PE chips)."""
    if len(rows[0]) < 2 or not nbytes:
        return None
    elems = padded(-(-nbytes // eb), len(rows[0]))
    latency, algo, result = on_groups_run("all_reduce", [tuple(r) for r in rows], nbytes=elems * eb, dtype=dtype,
                                          machine=machine)
    return latency, algo, result, elems * eb * len(rows)


@state.cache


@by_fidelity(256)
def _experts(machine, rows: tuple, per_expert: tuple, h: int, i: int, dtype: str, eb: int, act: str):
    """The routed experts' GEMMs and activations on their chips, all chips in ONE
    simulation -> (RunResult, parts, flops), or None if no expert has rows."""
    kernels, deps, names = [], [], []
    for c, pes in enumerate(rows):
        prev = None
        for e in range(c, len(per_expert), len(rows)):
            m = per_expert[e]
            if not m:
                continue
            steps = [(f"e{e} gate/up {m}x{2 * i}x{h}", _gemm(machine, m, 2 * i, h, dtype, "n", pes).result, 4 * m * i * h),
                     (f"e{e} {act}", _vec(machine, act, m * i, pes, 1, dtype, eb), machine.math_flops(act) * m * i),
                     (f"e{e} mul", _vec(machine, "mul", m * i, pes, 2, dtype, eb), machine.math_flops("mul") * m * i),
                     (f"e{e} down {m}x{h}x{i}", _gemm(machine, m, h, i, dtype, "k", pes).result, 2 * m * h * i)]
            for label, result, flops in steps:
                kernels.append(result.programs)
                deps.append(frozenset() if prev is None else frozenset((prev,)))
                names.append((label, c, pes, flops))
                prev = len(kernels) - 1
    if not kernels:
        return None
    sched = simulate(kernels, deps, machine)
    parts = tuple(stream.OpRecord(label, (), "gemm" if "x" in label else "elementwise", ready / 1000,
                                  (finish - ready) / 1000, flops=flops, detail=f"chip {c}, PEs {pes[0]}-{pes[-1]}")
                  for (label, c, pes, flops), ready, finish in zip(names, sched.ready_ps, sched.finish_ps))
    return sched.result, parts, sum(n[3] for n in names)


def _vec(machine, op: str, n: int, pes: tuple, inputs: int, dtype: str, eb: int):
    return vector(machine, op, n, placed=Shard(0), pes=pes, shape=(n,), inputs=inputs, dtype=dtype, elem_bytes=eb)
