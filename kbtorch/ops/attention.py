"""Fused attention on the simulated PEs: ``F.scaled_dot_product_attention`` semantics.

``attention(q, k, v)`` (or timing-only ``shape=(B, Hq, Hkv, Lq, Lk, D)``) with grouped-query
heads (``Hq`` a multiple of ``Hkv``), torch's top-left causal mask and default scale
``1/sqrt(D)``. Two kernels share one pipeline (``attention_kernel``): *prefill* (Lq > 16 or
causal: FlashAttention over query blocks spread over the PEs) and *decode* (Lq <= 16, not
causal: the keys split over a group of PEs per (batch, kv head), partials merged in two
levels over IPCQ/DMA); ``attention_plan`` holds both decompositions. Default tilings: the
prefill block size ``br`` with the least analytic estimate among ``BR_CHOICES`` (tiles of
128 keys, chunks of 8 tiles); decode: all PEs, tiles of up to 256 keys.

Three passes over the same decomposition: the timing pass simulates the kernel; the
numeric pass recomputes it with torch (per item, the online softmax over the same chunks in
fp32, P cast to the input dtype before P V as the kernel stores it; decode partials merged
in the kernel's order), cast to the input dtype; the analytic pass (``estimate``) gives, per PE,
the slowest of DMA (bytes / its share of its HBM controller), GEMM and MATH (each tile at
the slower of compute and its TCM fetch), plus the pipeline's fill (first command issue,
a round trip and, when compute-bound, the first read), drain (the last chunk's work after
its Q K^T, or after its read when HBM-bound, and the output write) and, for decode, per
merge level the slices' transfer into one PE and their fetch; the slowest PE sets it.
``bound_ns`` (a lower bound) is the busiest single resource: a PE's GEMM or MATH work, its
reads at its slice's full bandwidth, or a controller's bytes at its uplink bandwidth.

Units: ns, bytes, flops; ``flops`` counts useful work only: 4 D per unmasked (query, key)
pair and query head.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from .. import limits
from ..kernel import launch
from . import attention_kernel as ak
from .attention_plan import AttentionShape, AttentionTiling, decode_plan, prefill_plan
from .contract import DTYPES, OpFamily, OpRun, Param, Sample, as_machine, check_pes, dtype_of, register
from .layout import ACC_BYTES

# NOTE: tiling choices of the kernel (block sizes, chunking, team fan-out), not hardware:
# every hardware number the plans use is asked of the machine.
DECODE_MAX_LQ = 16
BR_CHOICES = (4, 8, 16, 32, 64, 128, 256)
MAX_ROWS = 512
PREFILL_BC, PREFILL_CHUNK, PREFILL_TAIL, PREFILL_SHRINK = 128, 8, 64, 2
DECODE_BC, DECODE_CHUNK, DECODE_TAIL, DECODE_SHRINK, DECODE_FAN = 256, 1, 16, 2, 8
MIN_SPLIT_KEYS = 16


@dataclass(kw_only=True)
class AttentionRun(OpRun):
    """A simulated attention: kind (prefill or decode), shape, tiling and the output."""

    kind: str
    shape: AttentionShape
    tiling: AttentionTiling
    out: torch.Tensor | None = field(default=None, repr=False)


def _shape_of(q, k, v, shape, dtype) -> tuple[AttentionShape, bool]:
    """(sizes without mask, timing only); ValueError naming what is wrong."""
    if q is None:
        if shape is None or k is not None or v is not None:
            raise ValueError("attention: give tensors q, k and v, or shape=(B, Hq, Hkv, Lq, Lk, D) "
                             "for a timing-only run")
        if len(shape) != 6 or not all(isinstance(x, int) and x >= 1 for x in shape):
            raise ValueError(f"attention: shape {shape!r} must be six positive ints (B, Hq, Hkv, Lq, Lk, D)")
        return AttentionShape(*shape, dtype=dtype_of(dtype or "f16", "attention").name), True
    if shape is not None:
        raise ValueError("attention: give either tensors or shape=, not both")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"attention: {name} must be a 4-d tensor [B, H, L, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention: dtype mismatch: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if v.shape != k.shape:
        raise ValueError(f"attention: v shape {tuple(v.shape)} differs from k shape {tuple(k.shape)}")
    (b, hq, lq, d), (bk, hkv, lk, dk) = q.shape, k.shape
    if bk != b or dk != d:
        raise ValueError(f"attention: k shape {tuple(k.shape)} does not match q shape {tuple(q.shape)} "
                         "(batch and head dim must agree)")
    if min(b, hq, hkv, lq, lk, d) < 1:
        raise ValueError(f"attention: empty dimension in q {tuple(q.shape)} or k {tuple(k.shape)}")
    name = dtype_of(q, "attention").name
    if dtype is not None and dtype != name:
        raise ValueError(f"attention: dtype='{dtype}' but the tensors are {q.dtype}")
    return AttentionShape(b, hq, hkv, lq, lk, d, dtype=name), False


def _plan(machine, shape: AttentionShape, tiling: AttentionTiling, pes: list) -> tuple[str, list]:
    """(kind, works). NOTE: on PEs of several chips whose kv heads split evenly over them,
    each chip takes its own heads (as tensor parallelism across chips places them) and plans
    them on its PEs: spreading one head's keys over chips would gain no bandwidth, and
    dealing pairs over the PEs in order would load some chips more than others."""
    kind = "decode" if shape.lq <= DECODE_MAX_LQ and not shape.causal else "prefill"
    chips: dict = {}
    for pe in pes:
        chips.setdefault(machine.chip_of(pe), []).append(pe)
    groups = list(chips.values())
    if len(groups) == 1 or shape.hkv % len(groups) or len({len(g) for g in groups}) != 1:
        return kind, _plan_on(machine, kind, shape, tiling, pes)
    per = shape.hkv // len(groups)
    sub = replace(shape, hq=shape.hq // len(groups), hkv=per)
    return kind, [replace(w, items=tuple(replace(it, h=it.h + c * per) for it in w.items))
                  for c, group in enumerate(groups) for w in _plan_on(machine, kind, sub, tiling, group)]


def _plan_on(machine, kind: str, shape: AttentionShape, tiling: AttentionTiling, pes: list) -> list:
    if kind == "decode":
        return decode_plan(shape, tiling, pes, {pe: machine.hbm_port(pe)[0] for pe in pes})
    return prefill_plan(shape, tiling, pes)


def _fits(machine, shape, works) -> bool:
    cap = machine.capacity("tcm", works[0].pe)
    unique = {_signature(w): w for w in works}
    return all(ak.AttentionLayout(machine, w, shape).tcm_bytes() <= cap for w in unique.values())


def candidates(shape: AttentionShape, pes: list) -> list[AttentionTiling]:
    """Tilings the automatic choice compares (decode: one)."""
    if shape.lq <= DECODE_MAX_LQ and not shape.causal:
        pairs = shape.b * shape.hkv
        split = max(1, min(len(pes) // pairs, shape.lk // MIN_SPLIT_KEYS)) if pairs <= len(pes) else 1
        split -= split % DECODE_FAN if split > DECODE_FAN else 0       # whole teams
        return [AttentionTiling(shape.lq, min(DECODE_BC, shape.lk), DECODE_CHUNK, DECODE_TAIL, DECODE_SHRINK, split,
                                DECODE_FAN)]
    brs = sorted({min(br, shape.lq) for br in BR_CHOICES if shape.group * min(br, shape.lq) <= MAX_ROWS}) or [1]
    return [AttentionTiling(br, min(PREFILL_BC, shape.lk), PREFILL_CHUNK, PREFILL_TAIL, PREFILL_SHRINK) for br in brs]


def auto_tiling(machine, shape: AttentionShape, pes: list) -> AttentionTiling:
    """The candidate with the least analytic estimate among those that fit the TCM."""
    best = None
    for tiling in candidates(shape, pes):
        _, works = _plan(machine, shape, tiling, pes)
        if not _fits(machine, shape, works):
            continue
        ns = estimate(machine, shape, works)[0]
        if best is None or ns < best[0]:
            best = (ns, tiling)
    if best is None:
        raise ValueError(f"attention: head dim D={shape.d} ({shape.group} query heads per kv head, {shape.dtype}) "
                         f"is too large for the TCM ({machine.capacity('tcm', pes[0]) // 2**20} MiB per PE)")
    return best[1]


def estimate(machine, shape: AttentionShape, works: list) -> tuple[float, float]:
    """(analytic ns, lower bound ns): see the module docstring."""
    active: dict = {}
    for w in works:
        ctrl = machine.hbm_port(w.pe)[0]
        active[ctrl] = active.get(ctrl, 0) + _read_bytes(w, shape)
    worst = bound = 0.0
    seen: dict = {}
    for w in works:
        ctrl, own, up = machine.hbm_port(w.pe)
        key = (_signature(w), own, up, active[ctrl])
        if key not in seen:
            seen[key] = _pe_estimate(machine, shape, w, own, up, active[ctrl])
        ns, floor = seen[key]
        worst, bound = max(worst, ns), max(bound, floor, active[ctrl] / up)
    return worst, bound


def _signature(w) -> tuple:
    """What the estimate and the TCM layout of a PE's work depend on (PE ids and batch/head
    indices aside): groups of the same plan share it."""
    return (tuple(it.positions for it in w.items), tuple((c.item, c.keys, c.runs, c.first, c.last) for c in w.chunks),
            w.tree and (w.tree.size, w.tree.teams, w.tree.team == 0))


def _read_bytes(w, shape: AttentionShape) -> int:
    m = shape.group * max(it.positions for it in w.items)
    return sum(c.keys for c in w.chunks) * 2 * shape.d * shape.eb + len(w.items) * m * shape.d * shape.eb


def _pe_estimate(machine, shape, w, own: float, up: float, ctrl_bytes: int) -> tuple[float, float]:
    """(estimate, bound) of one PE: its HBM share is its part of its controller's bytes."""
    g, info, eb, d = machine.graph, machine.pes[w.pe], shape.eb, shape.d
    gemm = machine.engine_tflops(w.pe, "gemm", DTYPES[shape.dtype].rate) * 1000      # flop/ns
    vec = machine.engine_tflops(w.pe, "math", "fp32") * 1000
    tcm = g.edges[info.node("tcm"), info.node("gemm")]["bw_gbps"]
    port = machine.port_gbps(w.pe, "dma_rd")
    m = shape.group * max(it.positions for it in w.items)
    read = _read_bytes(w, shape)
    hbm = min(own, up * read / ctrl_bytes)
    flops = ak.math_costs(machine, w.pe)

    def tile(keys: int) -> tuple[float, float]:         # (GEMM: Q K^T + P V, MATH: softmax) of one tile
        mm = 2 * m * keys * d / gemm
        return (max(mm, (m + keys) * d * eb / tcm, m * keys * ACC_BYTES / tcm) + max(mm, (m + d) * keys * eb / tcm),
                max(flops["softmax"] * m * keys / vec, 2 * m * keys * ACC_BYTES / tcm))

    fold = max(2 * m * (d + 2) * ACC_BYTES / tcm, flops["merge"] * m * d / vec)
    runs = [(n, keys) for c in w.chunks for n, keys in c.runs]
    t_gemm = sum(n * tile(keys)[0] for n, keys in runs)
    t_math = sum(n * tile(keys)[1] for n, keys in runs) + fold * sum(1 for c in w.chunks if not c.first)
    steady = max(t_gemm, t_math, read / hbm)
    trip = machine.read_trip_ns(w.pe)
    last = tile(w.chunks[-1].keys)
    drain = last[1] + last[0] / 2 + fold + m * d * eb / hbm + trip
    fill = machine.issue.kind_ps("dma") / 1000 + trip
    if steady > read / hbm:             # compute-bound: the first read is not hidden
        fill += (m * d * eb + w.chunks[0].keys * 2 * d * eb) / hbm
    else:                               # HBM-bound: the last chunk's Q K^T waits for its read
        drain += last[0] / 2
    tree = 0.0
    if w.tree is not None:
        t = w.tree
        far = max(machine.pe_trip_ns(w.pe, p) for p in t.pes)
        part = m * (t.columns(d, 0)[1] + 2) * ACC_BYTES
        for parts in (t.size, t.teams if t.team == 0 else 1):
            if parts > 1:
                tree += (parts - 1) * part / port + parts * part / tcm + far
    return steady + fill + drain + tree, max(t_gemm, t_math, read / own)


def numeric(q, k, v, shape: AttentionShape, works: list, scale: float) -> torch.Tensor:
    """The output computed with torch on the kernel's decomposition (module docstring).

    Items with the same query range and chunks (one per (batch, kv head)) run as one batch;
    decode partials are kept per key range, batched over the (batch, kv head) pairs, and
    merged as the kernel does: each team's in rank order, then the teams in order (merging
    whole rows gives the values merging column slices does)."""
    out, g, d = torch.empty_like(q), shape.group, shape.d
    batches: dict = {}
    for w in works:
        for i, it in enumerate(w.items):
            sig = (it.q0, it.q1, tuple((c.k0, c.keys) for c in w.chunks if c.item == i))
            batches.setdefault(sig, []).append(it)
    kf, vf = k.float(), v.float()
    split = any(w.tree is not None for w in works)
    partial: dict = {}
    for (q0, q1, chunks), items in batches.items():
        b, h = torch.tensor([it.b for it in items]), torch.tensor([it.h for it in items])
        heads = h[:, None] * g + torch.arange(g)
        rows = q[b[:, None], heads, q0:q1].reshape(len(items), -1, d).float()
        pos = torch.arange(q0, q1).repeat(g)
        part = _online(rows, kf[b, h], vf[b, h], chunks, pos, scale, shape, q.dtype)
        if split:
            partial[chunks[0][0]] = part
        else:
            out[b[:, None], heads, q0:q1] = _normal(part, q.dtype).reshape(len(items), g, q1 - q0, d)
    if split:
        tree = works[0].tree
        ranks = [partial[w.items[0].k0] for w in works[:tree.size * tree.teams]]
        teams = [_merge(ranks[j * tree.size:(j + 1) * tree.size]) for j in range(tree.teams)]
        pairs = [(it.b, it.h) for it in batches[next(iter(batches))]]
        b, h = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
        heads = h[:, None] * g + torch.arange(g)
        out[b[:, None], heads] = _normal(_merge(teams), q.dtype).reshape(len(pairs), g, shape.lq, d)
    return out


def _online(rows, k, v, chunks, pos, scale: float, shape: AttentionShape, dtype):
    """Online softmax of ``rows`` [n, M, D] over ``chunks`` ((first key, keys) of ``k`` and
    ``v`` [n, Lk, D]): -> (row max, row sum, unnormalised output), fp32."""
    n, rows_n = rows.shape[:2]
    m = torch.full((n, rows_n), -math.inf)
    total = torch.zeros(n, rows_n)
    o = torch.zeros(n, rows_n, shape.d)
    for k0, keys in chunks:
        s = (rows @ k[:, k0:k0 + keys].transpose(1, 2)) * scale
        if shape.causal:
            s = s.masked_fill(torch.arange(k0, k0 + keys)[None, :] > pos[:, None], -math.inf)
        m_new = torch.maximum(m, s.amax(dim=2))
        p = torch.exp(s - m_new[..., None])
        alpha = torch.exp(m - m_new)
        total = total * alpha + p.sum(dim=2)
        o = o * alpha[..., None] + p.to(dtype).float() @ v[:, k0:k0 + keys]
        m = m_new
    return m, total, o


def _merge(parts: list) -> tuple:
    """(max, sum, output) of several partials merged at once, in list order."""
    top = torch.stack([p[0] for p in parts]).amax(dim=0)
    scales = [torch.exp(p[0] - top) for p in parts]
    return top, sum(p[1] * a for p, a in zip(parts, scales)), sum(p[2] * a[..., None] for p, a in zip(parts, scales))


def _normal(part, dtype) -> torch.Tensor:
    _, total, o = part
    return (o / total[..., None]).to(dtype)


def attention(q=None, k=None, v=None, *, shape=None, is_causal=False, scale=None, dtype=None, machine=None,
              pes=None, mode="fast", tiling=None, trace=False) -> AttentionRun:
    """Simulate ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=..., enable_gqa=True)``
    (tensors), or a timing-only run of ``shape=(B, Hq, Hkv, Lq, Lk, D)``; see the module doc."""
    machine = as_machine(machine)
    base, timing_only = _shape_of(q, k, v, shape, dtype)
    sh = AttentionShape(base.b, base.hq, base.hkv, base.lq, base.lk, base.d, bool(is_causal), base.dtype)
    pes = checked(machine, sh, pes)
    tiling = tiling or auto_tiling(machine, sh, pes)
    kind, works = _plan(machine, sh, tiling, pes)
    if not _fits(machine, sh, works):
        raise ValueError(f"attention: tiling ({tiling.describe()}) with D={sh.d} does not fit the TCM "
                         f"({machine.capacity('tcm', pes[0]) // 2**20} MiB per PE)")
    used = [w.pe for w in works]
    result = launch(ak.attention_kernel, used, machine, {w.pe: w for w in works}, sh, mode=mode, trace=trace,
                    name=f"attention {kind}")
    scale = 1 / math.sqrt(sh.d) if scale is None else float(scale)
    out = None if timing_only else numeric(q, k, v, sh, works, scale)
    ns, bound = estimate(machine, sh, works)
    return AttentionRun(op=f"attention {kind}", machine=machine, result=result, pes=tuple(used), dtype=sh.dtype,
                        flops=4 * sh.b * sh.hq * sh.scores * sh.d, analytic_ps=round(ns * 1000),
                        bound_ps=round(bound * 1000), plan=f"{kind} on {len(used)} PEs: {tiling.describe()}",
                        kind=kind, shape=sh, tiling=tiling, out=out)


def checked(machine, sh: AttentionShape, pes) -> list:
    """The checks before any work -> the PEs: GQA ratio, PEs, HBM capacity, tile limit."""
    if sh.hq % sh.hkv:
        raise ValueError(f"attention: Hq={sh.hq} query heads are not a multiple of Hkv={sh.hkv} kv heads")
    pes = check_pes(machine, pes, "attention")
    # NOTE: a lower bound of what the PEs hold: Q, K, V and the output spread evenly over them.
    need = (2 * sh.b * sh.hq * sh.lq + 2 * sh.b * sh.hkv * sh.lk) * sh.d * sh.eb
    what = f"attention B={sh.b} Hq={sh.hq} Hkv={sh.hkv} Lq={sh.lq} Lk={sh.lk} D={sh.d} {sh.dtype}"
    limits.check_hbm(machine, pes, -(-need // len(pes)), what)
    # NOTE: a lower bound of the tiles any tiling makes: key tiles of the largest size times
    # row blocks of the most rows.
    tiles = sh.b * sh.hkv * -(-sh.lk // max(DECODE_BC, PREFILL_BC)) * -(-sh.lq * sh.group // MAX_ROWS)
    limits.check("tiles", tiles, what)
    return pes


def reference(q, k, v, is_causal: bool = False, scale=None) -> torch.Tensor:
    """The definition of the numerics: torch's SDPA (GQA heads repeated), in fp32, cast back."""
    import torch.nn.functional as F
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal, scale=scale,
                                         enable_gqa=True)
    return out.to(q.dtype)


def _timing(machine=None, b=1, hq=1, hkv=1, lq=1, lk=1, d=128, causal=False, **kw) -> AttentionRun:
    return attention(shape=(b, hq, hkv, lq, lk, d), is_causal=causal, machine=machine, **kw)


def _check(machine=None, b=1, hq=1, hkv=1, lq=1, lk=1, d=128, causal=False, dtype=None, pes=None, **_) -> None:
    """The timing-only run's checks before any work."""
    base, _ = _shape_of(None, None, None, (b, hq, hkv, lq, lk, d), dtype)
    checked(as_machine(machine), AttentionShape(b, hq, hkv, lq, lk, d, bool(causal), base.dtype), pes)


def _numeric(machine=None, b=1, hq=1, hkv=1, lq=1, lk=1, d=128, causal=False, dtype="f16", **kw) -> tuple:
    """(run, output, reference): the family on seeded random Q, K, V."""
    g, t = torch.Generator().manual_seed(0), DTYPES[dtype].torch
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(t) for h, n in ((hq, lq), (hkv, lk), (hkv, lk)))
    run = attention(q, k, v, is_causal=causal, machine=machine, **kw)
    return run, run.out, reference(q, k, v, causal)


# NOTE: tolerance: the per-PE estimate against the simulation of the samples: tiny -30%,
# diewide -53% (the estimate leaves out the queueing at the shared memory, as GEMM's does).
# atol: online softmax in fp32 over tiles, output rounded to f16 (tests/test_attention.py).
register(OpFamily("attention", _timing, reference, (
    Param("b", "int", 1, "batch"), Param("hq", "int", required=True, help="query heads"),
    Param("hkv", "int", required=True, help="key/value heads"), Param("lq", "int", required=True, help="query length"),
    Param("lk", "int", required=True, help="key length"), Param("d", "int", 128, "head dimension"),
    Param("causal", "flag", False, "causal mask"), Param("dtype", "dtype", "f16"), Param("pes", "pes")),
    help="fused attention: FlashAttention-style prefill, split-KV decode",
    samples=(Sample(dict(hq=4, hkv=2, lq=128, lk=128, d=64, causal=True)),
             Sample(dict(hq=8, hkv=2, lq=1, lk=1024, d=64, dtype="bf16"))),
    bad=(Sample(dict(hq=3, hkv=2, lq=1, lk=8), "hkv"), Sample(dict(hq=2, hkv=2, lq=0, lk=8), "lq"),
         Sample(dict(hq=2, hkv=2, lq=1, lk=8, pes=[]), "pes"),
         Sample(dict(hq=2, hkv=2, lq=1, lk=8, dtype="x"), "dtype")),
    tolerance=0.55, numeric=_numeric, atol=2e-2, check=_check))
