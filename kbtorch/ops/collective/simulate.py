"""One collective simulated: ``collective`` checks the request (``checked``), chooses its
algorithm (``choice.choose``) or builds the one asked (``build``), runs the kernel on the
simulator and, with shards, the schedule on torch tensors (``schedules.reference``), and
reports both with the models beside them (``CollectiveRun``).

``nbytes`` is the per-member buffer as nccl-tests counts it: the whole tensor of an
all-reduce, the input of a reduce-scatter, the output of an all-gather, the broadcast
buffer, the input (= output) of an all-to-all. Bus bandwidth follows nccl-tests too:
``algbw * 2(n-1)/n`` (all-reduce), ``* (n-1)/n`` (reduce-scatter, all-gather, all-to-all),
``* 1`` (broadcast). A group ``across:LEVEL`` makes the units of a level the members
(``units``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...kernel import fast_forward, run_programs
from ...kernel import steady
from ...kernel.policy import collective_mode
from ...kernel.door import MODES, paused_gc
from ... import limits
from ..contract import OpRun, as_machine, dtype_of
from ..layout import page_align
from . import analytic
from . import units
from .algorithms import ALGOS
from .build import build, build_lines
from .choice import choose
from .groups import make_grid, resolve_group
from .request import KINDS, OPS, ORDERS, CollectiveError, Request
from .schedules import pad, reference

BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0,
              "all_to_all": lambda n: (n - 1) / n}


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
                "events": self.result.events, "wall_s": self.result.wall_s,
                "obtained": self.result.obtained.as_dict()}


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


def checked(req: Request) -> tuple:
    """The checks before any work -> (PEs, bytes per member, dtype): kind, reduction, group,
    sizes, HBM capacity, root, order, mode and packet size."""
    kind, machine = req.kind, req.machine
    _check_kind(req)
    if req.op not in OPS:
        raise CollectiveError(f"unknown reduction '{req.op}' (known: {', '.join(OPS)})")
    pes = resolve_group(machine, req.group)
    nbytes, dtype = _shards(kind, req.shards, len(pes), req.nbytes, req.dtype)
    _check_members(req, pes, len(pes), nbytes)
    return pes, nbytes, dtype


def _check_kind(req: Request) -> None:
    if req.kind not in KINDS:
        raise CollectiveError(f"unknown collective '{req.kind}' (known: {', '.join(KINDS)})")


def _check_members(req: Request, pes, members: int, nbytes: int) -> None:
    """HBM capacity of ``pes``, the root among ``members`` ranks, order, mode and packet size."""
    machine, kind = req.machine, req.kind
    regions = {"all_reduce": 4, "reduce_scatter": 4, "all_to_all": 3 * members}.get(kind, 3)  # in, out, 2 scratch
    try:
        limits.check_hbm(machine, pes, regions * page_align(machine, nbytes), f"{kind} of {nbytes} bytes per member")
    except ValueError as exc:
        raise CollectiveError(str(exc)) from None
    if not 0 <= req.root < members:
        raise CollectiveError(f"broadcast root {req.root} is not a member rank (0..{members - 1})")
    if req.order not in ORDERS:
        raise CollectiveError(f"unknown block order '{req.order}' (known: {', '.join(ORDERS)})")
    _check_mode(req.mode)
    if req.packet_bytes is not None and req.packet_bytes < machine.flit_bytes:
        raise CollectiveError(f"packet_bytes={req.packet_bytes}: a packet is at least one flit "
                              f"({machine.flit_bytes} bytes)")
    if req.mode == "flit":
        # NOTE: a lower bound on the flits any algorithm sends, checked before anything is
        # built: each of the others receives what it lacks (a reduce-scatter: a share of it).
        lacks = (members - 1) * nbytes // (members if kind in ("reduce_scatter", "reduce") else 1)
        try:
            limits.check("flits", -(-lacks // machine.flit_bytes), f"a flit-exact {kind} of {nbytes} bytes over "
                         f"{members} members sends at least")
        except ValueError as exc:
            raise CollectiveError(str(exc)) from None


def _check_mode(mode: str) -> None:
    if mode not in ("auto", *MODES):
        raise CollectiveError(f"unknown mode '{mode}' (known: auto, {', '.join(MODES)})")


def collective(kind: str, shards=None, *, group="all", algo: str = "auto", op: str = "sum", root: int = 0,
               nbytes: int | None = None, dtype: str = "f16", machine=None, packet_bytes: int | None = None,
               mode: str = "auto", order: str = "rank", fidelity: str | None = None) -> CollectiveRun:
    """Run collective ``kind`` on the simulator (and on ``shards`` with torch, if given), on
    ``machine`` (default: the current one, ``kbtorch.use``). ``order``: which blocks are a
    reduce-scatter's or all-gather's member's (``schedules.schedule``); ``fidelity``: ``auto``
    or ``exact`` (None: the one in force, ``kernel.use_fidelity``; see ``_simulated``)."""
    try:
        fidelity = steady.check(fidelity)
    except ValueError as exc:
        raise CollectiveError(str(exc)) from None
    with paused_gc():
        req = Request(kind, as_machine(machine), group=group, algo=algo, op=op, root=root, nbytes=nbytes, dtype=dtype,
                      packet_bytes=packet_bytes, mode=mode, order=order, shards=shards, fidelity=fidelity)
        if isinstance(group, str) and group.startswith("across:"):
            return _across(req)
        return _one_group(req)


def _one_group(req: Request) -> CollectiveRun:
    pes, nbytes, dtype = checked(req)
    req = replace(req, nbytes=nbytes, dtype=dtype)
    req, built, cands = _built(req, [pes], None, f"{len(pes)} members")
    mode = collective_mode(req.mode, req.machine, nbytes * len(pes), built.programs, built.busy)
    grid = built.grids[0]
    result = _simulated(req, built, mode, lambda r: build(r, grid))
    outputs = None
    if req.shards is not None:
        kernel, sched = built.kernels[0], built.sched
        inputs = req.shards
        if kernel.nbytes != nbytes and req.kind != "all_to_all":
            inputs = pad(req.shards, kernel.nbytes, req.op)
        outputs = [o[:nbytes // req.elem_bytes] for o in reference(sched, inputs, req.op)]
    return _report(req, pes, built, result, mode, cands, outputs)


def checked_across(req: Request) -> tuple:
    """The checks of a collective across units (``across:chip``) before any work -> (the
    request with its bytes and dtype, units, level, lines, line sizes, PEs)."""
    _check_kind(req)
    n = len(units.units(req.machine, units.parse(req.group)[0]))
    nbytes, dtype = _shards(req.kind, req.shards, n, req.nbytes, req.dtype)
    req = replace(req, nbytes=nbytes, dtype=dtype)
    _check_mode(req.mode)
    if req.algo != "auto" and req.algo not in ALGOS:
        raise CollectiveError(f"unknown algorithm '{req.algo}' (known: {', '.join(ALGOS)})")
    level, lines, sizes = units.lines_of(req)
    pes = tuple(p for line in lines for p in line)
    _check_members(req, pes, n, nbytes)
    return req, n, level, lines, sizes, pes


def _across(req: Request) -> CollectiveRun:
    """A collective whose members are the units of a level (``across:chip``): see ``units``."""
    machine = req.machine
    req, n, level, lines, sizes, pes = checked_across(req)
    nbytes = req.nbytes
    req, built, cands = _built(req, lines, sizes, f"{n} {level}s")
    mode = collective_mode(req.mode, machine, nbytes * len(pes), built.programs, built.busy)
    result = _simulated(req, built, mode, lambda r: build_lines(r, lines, sizes))
    outputs = units.numerics(req, lines, sizes) if req.shards is not None else None
    return _report(req, pes, built, result, mode, cands, outputs, n_units=n)


def _simulated(req: Request, built, mode: str, rebuild):
    """The RunResult of kernel ``built`` in ``mode``. ``fidelity="auto"``: where all its lines
    have the same rounds of packets, those are fast-forwarded once steady (``kernel.steady``:
    ``rebuild(request)`` builds the kernel again, truncated to ``request.rounds``); else, and
    with ``exact``, every event is simulated. The result keeps the whole kernel's programs."""
    rounds = {k.rounds for k in built.kernels}
    if req.fidelity == "auto" and len(rounds) == 1:
        machine = req.machine
        got = fast_forward(lambda q: run_programs(rebuild(replace(req, rounds=q)).programs, machine, mode=mode),
                           rounds.pop() - 1, req.fidelity)
        if got is not None:
            got.programs = built.programs
            return got
    return steady.simulated(run_programs(built.programs, req.machine, mode=mode), req.fidelity)


def _built(req: Request, lines: list, sizes: list | None, members: str) -> tuple:
    """(``req`` with its algorithm, that algorithm built, the candidates' ps): for ``auto``
    the choice (``choice.choose``), else the algorithm asked; one group (``sizes`` None) or
    the lines across units. ``members``: who the error names when no algorithm applies."""
    if req.algo != "auto":
        one = build(req, make_grid(req.machine, lines[0])) if sizes is None else build_lines(req, lines, sizes)
        return req, one, {}
    choice = choose(req, lines, sizes=sizes)
    if choice is None:
        raise CollectiveError(f"{req.kind}: no algorithm applies to {req.nbytes} bytes over {members}")
    return replace(req, algo=choice.algo), choice.built, choice.candidates


def _report(req: Request, pes: tuple, built, result, mode: str, cands: dict, outputs,
            n_units: int = 0) -> CollectiveRun:
    """The run of ``req`` (its algorithm chosen) with the bound and the models beside it;
    the analytic estimate is the chosen candidate's, else the first line's alpha-beta;
    ``n_units``: the members of a collective across units (0: the PEs are)."""
    busy, startup, sched, kernel = built.busy, built.startup, built.sched, built.kernels[0]
    eb = req.elem_bytes
    worst = max(busy, key=lambda r: (busy[r], analytic.describe(r)))
    estimate = cands[req.algo] if req.algo in cands else analytic.alpha_beta_ps(
        req.machine, sched, built.grids[0].pes, kernel.nbytes // sched.blocks, kernel.packet_elems * eb)
    return CollectiveRun(op=req.kind, machine=req.machine, result=result, pes=tuple(pes), dtype=req.dtype,
                         analytic_ps=estimate, bound_ps=max(startup, busy[worst]), plan=req.algo, algo=req.algo,
                         reduction=req.op, nbytes=req.nbytes, mode=mode, startup_ps=startup,
                         limiter="startup" if startup >= busy[worst] else analytic.describe(worst),
                         candidates=cands, root=req.root, packet_bytes=kernel.packet_elems * eb, units=n_units,
                         outputs=outputs)
