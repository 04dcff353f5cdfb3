"""The automatic algorithm choice (``algo="auto"``), like NCCL's tuner: which algorithms
apply to a request and the predicted time of each (``estimates``: the step-by-step
alpha-beta estimate of ``analytic``), and the one chooser (``choose``) that takes from them
for one group, for the lines of a collective across units and for groups side by side."""
from __future__ import annotations

from dataclasses import dataclass, replace

from . import analytic
from .algorithms import ALGOS, LINE_ALGOS
from .build import BLOCKED, Built, build, build_lines
from .groups import make_grid
from .kernel_layout import largest_xfer_blocks, packet_size, padded_bytes
from .request import CollectiveError, Request
from .schedules import schedule

DIRECT_MAX = 32


@dataclass(frozen=True)
class Choice:
    """The algorithm chosen, what the choice built of it (None: nothing; the run builds it)
    and the candidates' predicted ps as reported (``CollectiveRun.candidates``)."""

    algo: str
    built: Built | None
    candidates: dict


def estimates(req: Request, grid) -> dict:
    """Predicted time (ps) of every algorithm that applies to ``req`` on ``grid``: ``{algo: ps}``.

    NOTE: ``direct`` is left out above ``DIRECT_MAX`` members: its n x n messages cost every
    member n - 1 command issues per phase, which no payload size makes up for there. Above
    that size, too, an algorithm whose command-issue floor (a lower bound of its estimate)
    already exceeds the best estimate so far is not estimated (fewest steps first)."""
    machine, eb = req.machine, req.elem_bytes
    big = len(grid.pes) > DIRECT_MAX
    scheds = []
    for algo in ALGOS:
        if algo == "direct" and big:
            continue
        try:
            sched = schedule(req.kind, algo, grid, req.root, req.order)
        except CollectiveError:
            continue
        padded = padded_bytes(sched, req.nbytes, eb)
        if padded is None:
            continue
        scheds.append((len(sched.steps), ALGOS.index(algo), algo, sched, padded))
    out, best = {}, None
    for _, _, algo, sched, padded in sorted(scheds, key=lambda t: t[:2]):
        block = padded // sched.blocks
        packet = req.packet_bytes or packet_size(largest_xfer_blocks(sched) * block)
        if big and best is not None and analytic.issue_ps(machine, sched, block, packet) >= best:
            continue
        out[algo] = analytic.alpha_beta_ps(machine, sched, grid.pes, block, packet)
        best = out[algo] if best is None else min(best, out[algo])
    return {a: out[a] for a in ALGOS if a in out}


def choose(req: Request, lines: list, *, sizes: list | None = None, side_by_side: bool = False) -> Choice | None:
    """The algorithm of ``req`` on ``lines`` (PE tuples), with the least predicted time:

    - one group (``lines``: its PEs alone): the estimates checked against the built
      kernels' bounds (``_by_bound``);
    - the lines of a collective across units (``sizes``: each line's share of a member's
      block, ``units.shares``): every algorithm ranked by the larger of one line's estimate
      and the bound of all lines built together, over their shared links (``_over_lines``);
    - groups side by side (``side_by_side``, each group ``req.nbytes`` per member, as
      ``side_by_side.on_groups`` runs them): every group inside a chip of its own (they share
      no link) as one group chooses; every group across chips (lines of a mesh dimension
      over a system) as the lines across units do; else (groups sharing one chip) among
      ``LINE_ALGOS`` (``ring`` if none applies) the least estimate of the first group alone.

    None: no algorithm applies (one group, lines across units); groups side by side fall
    back to ``ring``.

    NOTE: a decode step's activations are latency-bound: a ring of n chips takes 2(n - 1)
    network steps, recursive doubling log2 n, and tree wins there either way. A prefill's
    are not, and one line's estimate misses what lines sharing links cost each other:
    Llama-3-70B TP 8's prefill all-reduce across the 8 chips, 36 lines of 932 KB, takes
    122.7 us by tree (the least one-line estimate) and 57.8 us by hier (chosen with the
    lines' bound; 2d 87.0, bidir-ring 84.3, direct 110.9); its all-gather 64.6 -> 28.6 us,
    reduce-scatter 56.2 -> 34.2. Inside chips (TP 8's 252 KiB reduce-scatter over each
    chip's 36 tiles): 2d 2.7 us against ring 3.9; a prefill's 32 MiB, ring 182 us, where
    2d's estimate is as low as ring's and it takes 488."""
    grid = make_grid(req.machine, lines[0])
    if sizes is not None:
        return _over_lines(req, lines, sizes, grid)
    cands = estimates(req, grid)
    if not side_by_side:
        return _by_bound(req, grid, cands)
    chips = [{req.machine.chip_of(pe) for pe in g} for g in lines]
    if all(len(c) == 1 for c in chips) and len(set().union(*chips)) == len(lines):
        return _by_bound(req, grid, cands) or Choice("ring", None, {})
    per = req.elem_bytes * (len(grid.pes) if req.kind in BLOCKED else 1)
    if all(len(c) > 1 for c in chips) and req.nbytes % per == 0:
        got = _over_lines(req, lines, [req.nbytes // per] * len(lines), grid)
        if got is not None:
            return got
    est = {a: ps for a, ps in cands.items() if a in LINE_ALGOS}
    return Choice(min(est, key=est.get) if est else "ring", None, {})


def _by_bound(req: Request, grid, cands: dict) -> Choice | None:
    """The candidate (of ``cands``: algorithm -> estimate) whose built kernel has the least
    bound, taken in the order of the estimates. NOTE: the estimate can miss what the built
    kernel shows (its busiest resource, e.g. command issue): the next candidate is built
    while this one's bound exceeds the next one's estimate."""
    if not cands:
        return None
    ranked = sorted(cands, key=lambda a: (cands[a], ALGOS.index(a)))
    built = []
    bound_of: dict = {}         # a schedule, its algorithm's name aside -> its built kernel's bound
    for i, name in enumerate(ranked):
        # NOTE: an algorithm whose schedule is an earlier one's on this group (hier inside one
        # chip is 2d) has its bound and comes later in the order: it cannot win, and is not built.
        same = replace(schedule(req.kind, name, grid, req.root, req.order), algo="")
        if same not in bound_of:
            one = build(replace(req, algo=name), grid)
            built.append((one.bound, i, name, one))
            bound_of[same] = one.bound
        if i + 1 == len(ranked) or bound_of[same] <= cands[ranked[i + 1]]:
            break
    _, _, name, one = min(built)
    return Choice(name, one, cands)


def _over_lines(req: Request, lines: list, sizes: list, grid) -> Choice | None:
    """The lines' choice: the larger of one line's estimate (``grid``: the first line's, on
    its share) and the bound of all lines built together, least. NOTE: algorithms are built
    in the order of their one-line estimates and the search stops where that estimate alone
    reaches the best so far (it cannot win)."""
    share = sizes[0] * req.elem_bytes * (len(lines[0]) if req.kind in BLOCKED else 1)
    alone = estimates(replace(req, nbytes=share), grid)
    out, best = {}, None
    for algo in sorted(alone, key=lambda a: (alone[a], ALGOS.index(a))):
        if best is not None and alone[algo] >= best:
            break
        try:
            built = build_lines(replace(req, algo=algo), lines, sizes)
        except CollectiveError:
            continue
        out[algo] = (max(alone[algo], built.bound), built)
        best = out[algo][0] if best is None else min(best, out[algo][0])
    if not out:
        return None
    algo = min(out, key=lambda a: (out[a][0], ALGOS.index(a)))
    return Choice(algo, out[algo][1], {a: ps for a, (ps, _) in out.items()})

