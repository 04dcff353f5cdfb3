"""Collectives on the simulated PEs: all-reduce, reduce-scatter, all-gather, broadcast, all-to-all.

Two independent passes over one schedule (``collective_plan``): the numeric pass interprets
it on torch tensors (each member's shard), the timing pass runs the collective tile kernel
(``collective_kernel``) on the simulator. ``nbytes`` is the per-member buffer as
nccl-tests counts it: the whole tensor of an all-reduce, the input of a reduce-scatter, the
output of an all-gather, the broadcast buffer, the input (= output) of an all-to-all. Bus
bandwidth follows nccl-tests too: ``algbw * 2(n-1)/n`` (all-reduce), ``* (n-1)/n``
(reduce-scatter, all-gather, all-to-all), ``* 1`` (broadcast).

``algo="auto"`` picks, like NCCL's tuner, the algorithm with the least predicted time: the
step-by-step alpha-beta estimate of ``collective_model`` for every algorithm that applies
to this group and payload (``collective_choice``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

import torch

from ..sim.engine import paused_gc
from ..sim.network import MODES
from .. import limits
from ..kernel import run_programs
from .contract import DTYPES, OpFamily, OpRun, Param, Sample, as_machine, dtype_of, register, sim_mode
from . import collective_model as model
from . import collective_units as units
from .collective_choice import estimates, padded_bytes
from .collective_group import make_grid, resolve_group
from .collective_kernel import CollectiveKernel
from .layout import page_align
from .collective_plan import ALGOS, KINDS, OPS, ORDERS, CollectiveError, reference, schedule

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
              "all_to_all": lambda n: (n - 1) / n}
#: Above this many bytes moved in all (nbytes x members x 3), ``mode="auto"`` runs coarse.
COARSE_BYTES = 4 * 2**30
#: Above this many commands in the built kernel (all members' programs), ``mode="auto"``
#: runs coarse.
# NOTE: the fast mode's wall time grows with the kernel's commands as well as its bytes:
# in torch's rank order (``order="rank"``, one packet per strided block) a 2d all-gather
# of 65 280 commands over 256 PEs takes 13 to 32 s, a 2d reduce-scatter of 185 344
# commands 56 to 82 s (coarse: within 3% of their latencies, 1.5x to 3x faster; the same
# reduce-scatter in grid order has 10 312 commands and takes 14 s fast),
# a hierarchical all-reduce of 7 KiB (3 072 commands) 2 s. 50 000 commands is where a
# fast run reaches tens of seconds; small all-reduces stay well below it (and fast: coarse
# is up to 7% off on them), as does a 1 KiB ring over one SIP (47 616).
COARSE_COMMANDS = 50_000


@dataclass(kw_only=True)
class CollectiveRun(OpRun):
    """A simulated collective: the algorithm, bandwidths, the models beside it, the outputs.
    ``op`` is the collective (``all_reduce`` ...), ``reduction`` its reduction op."""

    algo: str
    reduction: str
    nbytes: int
    mode: str
    startup_ps: int
    limiter: str
    candidates: dict = field(default_factory=dict)
    root: int = 0
    packet_bytes: int = 0
    units: int = 0          # members of a collective across units (``across:chip``), else 0
    outputs: list | None = field(default=None, repr=False)

    @property
    def members(self) -> int:
        """Members as nccl-tests counts them: the units (chips) of ``across:LEVEL``, else the PEs."""
        return self.units or len(self.pes)

    @property
    def kind(self) -> str:
        return self.op

    @property
    def bottleneck(self) -> str:
        """``startup`` or the busiest resource of the bound (not the attribution's largest kind)."""
        return self.limiter

    @property
    def algbw_gbps(self) -> float:
        return self.nbytes / self.latency_ns

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * BUS_FACTOR[self.kind](self.members)

    def as_dict(self) -> dict:
        return {"collective": self.kind, "algo": self.algo, "members": self.members, "pes": len(self.pes),
                "op": self.reduction if self.kind in ("all_reduce", "reduce_scatter") else None,
                "root": self.root if self.kind == "broadcast" else None, "packet_bytes": self.packet_bytes,
                "bytes": self.nbytes, "dtype": self.dtype, "mode": self.mode,
                "latency_ns": self.latency_ns, "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
                "bound_ns": self.bound_ps / 1000, "pct_bound": self.pct_bound, "startup_ns": self.startup_ps / 1000,
                "bottleneck": self.bottleneck, "analytic_ns": self.analytic_ps / 1000,
                "candidates_ns": {a: ps / 1000 for a, ps in self.candidates.items()},
                "events": self.result.events, "wall_s": self.result.wall_s}


def _shards(kind: str, shards, n: int, nbytes, dtype):
    """Validate shards (one tensor per member) -> (nbytes per member, dtype name)."""
    if shards is None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise CollectiveError("give shards, or nbytes > 0 for a timing-only run")
        try:
            d = dtype_of(dtype, kind)
        except ValueError as exc:
            raise CollectiveError(str(exc)) from None
        if nbytes % d.bytes:
            raise CollectiveError(f"{kind}: {nbytes} bytes is not a whole number of {d.name} elements "
                                  f"({d.bytes} bytes each)")
        return nbytes, d.name
    if len(shards) != n:
        raise CollectiveError(f"{kind}: {len(shards)} shards for a group of {n} members")
    first = shards[0]
    for i, t in enumerate(shards):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise CollectiveError(f"{kind}: shard {i} is {tuple(t.shape)} {t.dtype}, shard 0 is "
                                  f"{tuple(first.shape)} {first.dtype}; all shards must match")
    try:
        name = dtype_of(first, kind).name
    except ValueError as exc:
        raise CollectiveError(str(exc)) from None
    per = first.numel() * first.element_size() * (n if kind == "all_gather" else 1)
    return per, name


def _pad(shards: list, nbytes: int, op: str) -> list:
    """Each member's buffer flattened and padded to ``nbytes`` with the reduction's identity."""
    fill = 0.0 if op == "sum" else float("-inf")
    out = []
    for t in shards:
        flat = t.reshape(-1)
        extra = nbytes // flat.element_size() - flat.numel()
        out.append(torch.cat([flat, flat.new_full((extra,), fill)]) if extra else flat)
    return out


def _build(kind, algo, machine, grid, nbytes, eb, dtype, op, root, packet_bytes, order):
    """(schedule, kernel, programs, busy ps per resource, startup ps) of one algorithm."""
    sched = schedule(kind, algo, grid, root, order)
    padded = padded_bytes(sched, nbytes, eb)
    if padded is None:
        raise CollectiveError(f"{algo} {kind}: {nbytes} bytes per member ({nbytes // eb} elements of {eb} bytes) "
                              f"do not split into {sched.blocks} equal blocks")
    kernel = CollectiveKernel(machine, sched, grid, padded, eb, dtype, op, packet_bytes)
    programs = kernel.programs()
    # NOTE: the bound's packet is one piece of one block: a kernel that sent blocks one by one
    # would not wait for a whole packet of several blocks.
    startup = model.startup_ps(machine, sched, grid.pes, min(kernel.packet_elems, kernel.block_elems) * eb)
    return sched, kernel, programs, model.resource_ps(machine, programs), startup


def _mode(mode: str, machine, nbytes: int, pes, programs: dict, busy: dict) -> str:
    """The simulation mode of ``mode="auto"``: coarse when the collective moves more than
    ``COARSE_BYTES`` in all (nbytes x members x 3), its kernel has more than
    ``COARSE_COMMANDS`` commands or its traffic crosses links more than
    ``contract.COARSE_FLIT_HOPS`` times (``busy``: its resource load, ``sim_mode``), else
    fast; an explicit mode as given."""
    big = 3 * nbytes * len(pes) > COARSE_BYTES or sum(len(c) for c in programs.values()) > COARSE_COMMANDS
    return sim_mode(mode, machine, programs, busy, big)


def collective(kind: str, shards=None, *, group="all", algo: str = "auto", op: str = "sum", root: int = 0,
               nbytes: int | None = None, dtype: str = "f16", machine=None, packet_bytes: int | None = None,
               mode: str = "auto", order: str = "rank") -> CollectiveRun:
    """Run collective ``kind`` on the simulator (and on ``shards`` with torch, if given), on
    ``machine`` (default: the current one, ``kbtorch.use``). ``order``: which blocks are a
    reduce-scatter's or all-gather's member's (``collective_plan.schedule``)."""
    with paused_gc():
        return _collective(kind, shards, group, algo, op, root, nbytes, dtype, machine, packet_bytes, mode, order)


def checked(kind, shards, group, op, root, nbytes, dtype, machine, packet_bytes, mode, order) -> tuple:
    """The checks before any work -> (PEs, bytes per member, dtype): kind, reduction, group,
    sizes, HBM capacity, root, order, mode and packet size."""
    if kind not in KINDS:
        raise CollectiveError(f"unknown collective '{kind}' (known: {', '.join(KINDS)})")
    if op not in OPS:
        raise CollectiveError(f"unknown reduction '{op}' (known: {', '.join(OPS)})")
    pes = resolve_group(machine, group)
    nbytes, dtype = _shards(kind, shards, len(pes), nbytes, dtype)
    regions = {"all_reduce": 4, "reduce_scatter": 4, "all_to_all": 3 * len(pes)}.get(kind, 3)  # in, out, 2 scratch
    try:
        limits.check_hbm(machine, pes, regions * page_align(machine, nbytes), f"{kind} of {nbytes} bytes per member")
    except ValueError as exc:
        raise CollectiveError(str(exc)) from None
    if not 0 <= root < len(pes):
        raise CollectiveError(f"broadcast root {root} is not a member rank (0..{len(pes) - 1})")
    if order not in ORDERS:
        raise CollectiveError(f"unknown block order '{order}' (known: {', '.join(ORDERS)})")
    if mode not in ("auto", *MODES):
        raise CollectiveError(f"unknown mode '{mode}' (known: auto, {', '.join(MODES)})")
    if packet_bytes is not None and packet_bytes < machine.flit_bytes:
        raise CollectiveError(f"packet_bytes={packet_bytes}: a packet is at least one flit ({machine.flit_bytes} bytes)")
    return pes, nbytes, dtype


def _collective(kind, shards, group, algo, op, root, nbytes, dtype, machine, packet_bytes, mode,
                order) -> CollectiveRun:
    machine = as_machine(machine)
    if isinstance(group, str) and group.startswith("across:"):
        return _across(kind, shards, group, algo, op, root, nbytes, dtype, machine, packet_bytes, mode, order)
    pes, nbytes, dtype = checked(kind, shards, group, op, root, nbytes, dtype, machine, packet_bytes, mode, order)
    grid = make_grid(machine, pes)
    eb = DTYPES[dtype].bytes
    cands = estimates(kind, machine, grid, nbytes, eb, root, packet_bytes, order) if algo == "auto" else {}
    if algo == "auto" and not cands:
        raise CollectiveError(f"{kind}: no algorithm applies to {nbytes} bytes over {len(pes)} members")
    algo, sched, kernel, programs, busy, startup = choose(kind, machine, grid, nbytes, eb, dtype, op, root,
                                                          packet_bytes, order, cands or {algo: 0})
    mode = _mode(mode, machine, nbytes, pes, programs, busy)
    result = run_programs(programs, machine, mode=mode)
    worst = max(busy, key=lambda r: (busy[r], model.describe(r)))
    bound = max(startup, busy[worst])
    analytic = cands[algo] if algo in cands else model.alpha_beta_ps(
        machine, sched, pes, kernel.nbytes // sched.blocks, kernel.packet_elems * eb)
    outputs = None
    if shards is not None:
        inputs = _pad(shards, kernel.nbytes, op) if kernel.nbytes != nbytes and kind != "all_to_all" else shards
        outputs = [o[:nbytes // eb] for o in reference(sched, inputs, op)]
    return CollectiveRun(op=kind, machine=machine, result=result, pes=tuple(pes), dtype=dtype, analytic_ps=analytic,
                         bound_ps=bound, plan=algo, algo=algo, reduction=op, nbytes=nbytes, mode=mode,
                         startup_ps=startup, limiter="startup" if startup >= busy[worst] else model.describe(worst),
                         candidates=cands, root=root, packet_bytes=kernel.packet_elems * eb, outputs=outputs)


def choose(kind, machine, grid, nbytes, eb, dtype, op, root, packet_bytes, order, cands: dict) -> tuple:
    """The candidate (of ``cands``: algorithm -> estimate) whose built kernel has the least
    bound, taken in the order of the estimates: -> (algorithm, schedule, kernel, programs,
    resource load, startup). NOTE: the estimate can miss what the built kernel shows (its
    busiest resource, e.g. command issue): the next candidate is built while this one's
    bound exceeds the next one's estimate."""
    ranked = sorted(cands, key=lambda a: (cands[a], ALGOS.index(a) if a in ALGOS else len(ALGOS)))
    built = []
    bound_of: dict = {}         # a schedule, its algorithm's name aside -> its built kernel's bound
    for i, name in enumerate(ranked):
        # NOTE: an algorithm whose schedule is an earlier one's on this group (hier inside one
        # chip is 2d) has its bound and comes later in the order: it cannot win, and is not built.
        sched = schedule(kind, name, grid, root, order)
        same = replace(sched, algo="")
        if same not in bound_of:
            sched, kernel, programs, busy, startup = _build(kind, name, machine, grid, nbytes, eb, dtype, op, root,
                                                            packet_bytes, order)
            built.append((max(startup, max(busy.values())), i, name, sched, kernel, programs, busy, startup))
            bound_of[same] = built[-1][0]
        if i + 1 == len(ranked) or bound_of[same] <= cands[ranked[i + 1]]:
            break
    return min(built)[2:]


def _across(kind, shards, group, algo, op, root, nbytes, dtype, machine, packet_bytes, mode, order) -> CollectiveRun:
    """A collective whose members are the units of a level (``across:chip``): see ``collective_units``."""
    n = len(units.units(machine, units.parse(group)[0]))
    nbytes, dtype = _shards(kind, shards, n, nbytes, dtype)
    eb = DTYPES[dtype].bytes
    if mode not in ("auto", *MODES):
        raise CollectiveError(f"unknown mode '{mode}' (known: auto, {', '.join(MODES)})")
    if algo != "auto" and algo not in ALGOS:
        raise CollectiveError(f"unknown algorithm '{algo}' (known: {', '.join(ALGOS)})")
    algo, lines, sizes, built, result, mode, cands = units.run(kind, group, algo, machine, nbytes, eb, dtype, op, root,
                                                         packet_bytes, mode, order, _build, _mode, estimates)
    sched, kernels, programs, busy, startup = built
    pes = tuple(p for line in lines for p in line)
    worst = max(busy, key=lambda r: (busy[r], model.describe(r)))
    k0 = kernels[0]
    analytic = cands.get(algo) or model.alpha_beta_ps(machine, sched, lines[0], k0.nbytes // sched.blocks,
                                                      k0.packet_elems * eb)
    outputs = None
    if shards is not None:
        pad = units.line_reference(kind, op, eb, padded_bytes, _pad)
        outputs = units.numerics(kind, algo, machine, lines, sizes, shards, op, root, order, pad)
    return CollectiveRun(op=kind, machine=machine, result=result, pes=pes, dtype=dtype, analytic_ps=analytic,
                         bound_ps=max(startup, busy[worst]), plan=algo, algo=algo, reduction=op, nbytes=nbytes,
                         mode=mode, startup_ps=startup,
                         limiter="startup" if startup >= busy[worst] else model.describe(worst), candidates=cands,
                         root=root, packet_bytes=k0.packet_elems * eb, units=n, outputs=outputs)


def all_reduce(shards=None, **kw) -> CollectiveRun:
    """Every member ends with the reduction (``op``: sum or max) of all members' buffers."""
    return collective("all_reduce", shards, **kw)


def reduce_scatter(shards=None, **kw) -> CollectiveRun:
    """Member i ends with block i of the reduction (torch's ``reduce_scatter_tensor`` order)."""
    return collective("reduce_scatter", shards, **kw)


def all_gather(shards=None, **kw) -> CollectiveRun:
    """Every member ends with the concatenation of all members' shards, in member order."""
    return collective("all_gather", shards, **kw)


def broadcast(shards=None, **kw) -> CollectiveRun:
    """Every member ends with the buffer of member ``root``."""
    return collective("broadcast", shards, **kw)


def all_to_all(shards=None, **kw) -> CollectiveRun:
    """Member d ends with block d of every member's buffer, in member order (torch's
    ``all_to_all_single`` with equal splits)."""
    return collective("all_to_all", shards, **kw)


def torch_reference(kind: str, shards: list, op: str = "sum", root: int = 0) -> list:
    """What torch.distributed would return on each member, computed directly."""
    n = len(shards)
    if kind == "all_to_all":
        return [torch.cat([s.reshape(-1).chunk(n)[d] for s in shards]) for d in range(n)]
    if kind == "all_gather":
        return [torch.cat([s.reshape(-1) for s in shards])] * n
    if kind == "broadcast":
        return [shards[root].reshape(-1)] * n
    acc = shards[0].reshape(-1).float()
    for s in shards[1:]:
        acc = OPS[op](acc, s.reshape(-1).float())
    acc = acc.to(shards[0].dtype)
    return [acc] * n if kind == "all_reduce" else list(acc.chunk(n))


def _timing(kind: str):
    def run(machine=None, nbytes=1 << 20, **kw) -> CollectiveRun:
        return collective(kind, machine=machine, nbytes=nbytes, **kw)
    return run


def _check(kind: str):
    def check(machine=None, nbytes=1 << 20, group="all", op="sum", root=0, dtype="f16", packet_bytes=None,
              mode="auto", order="rank", **_) -> None:
        """The timing-only run's checks before any work."""
        checked(kind, None, group, op, root, nbytes, dtype, as_machine(machine), packet_bytes, mode, order)
    return check


def _numeric(kind: str):
    def numeric(machine=None, nbytes=1 << 20, group="all", dtype="f16", op="sum", **kw) -> tuple:
        """(run, every member's output, ``torch_reference``'s): the family on seeded random shards."""
        n = len(resolve_group(as_machine(machine), group))
        g = torch.Generator().manual_seed(0)
        count = nbytes // DTYPES[dtype].bytes // (n if kind == "all_gather" else 1)
        shards = [torch.randn(count, generator=g).to(DTYPES[dtype].torch) for _ in range(n)]
        run = collective(kind, shards, group=group, op=op, machine=machine, **kw)
        got, want = (torch.cat([t.reshape(-1) for t in out])
                     for out in (run.outputs, torch_reference(kind, shards, op)))
        return run, got, want
    return numeric


# NOTE: tolerance: the alpha-beta estimate against the simulation of the samples, worst -36%
# (all-gather, ring over 4 PEs of tiny, 64 KiB; the others within 31%): steps overlap in the
# simulation, not in the estimate. atol: a sum of 8 f16 members rounded in another order.
for _kind in KINDS:
    register(OpFamily(_kind, _timing(_kind), partial(torch_reference, _kind), (
        Param("nbytes", "bytes", required=True, help="bytes per member (nccl-tests' count)"),
        Param("group", "str", "all", "all, a topology level (cube, sip, cube:N) or a PE list"),
        Param("algo", "str", "auto", choices=("auto", *ALGOS)), Param("op", "str", "sum", choices=tuple(OPS)),
        Param("dtype", "dtype", "f16"), Param("mode", "str", "auto", choices=("auto", *MODES))),
        help=f"collective {_kind}",
        samples=(Sample(dict(nbytes=65536)),
                 Sample(dict(nbytes=65536, group="0-3", algo="ring", op="max", dtype="fp32"))),
        bad=(Sample(dict(nbytes=0), "nbytes"), Sample(dict(nbytes=4097), "bytes"),
             Sample(dict(nbytes=4096, group="cube:99"), "group"), Sample(dict(nbytes=4096, algo="nope"), "algo")),
        tolerance=0.4, numeric=_numeric(_kind), atol=5e-2, check=_check(_kind)))
