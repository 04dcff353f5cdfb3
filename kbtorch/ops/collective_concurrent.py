"""Several collectives at once on one simulator: groups of PEs side by side (the device's
redistributions over every line of a mesh), sharing links, HBM controllers and routers.
"""
from __future__ import annotations

from ..kernel import run_programs
from ..sim import symmetry
from . import collective_model as model
from . import collective_rename as rename
from . import collective_units as units
from .collective import _build, _mode, choose, collective, estimates, padded_bytes
from .collective_group import make_grid, resolve_group
from .collective_kernel import CollectiveKernel
from .collective_plan import ALGOS, CollectiveError, schedule
from .contract import DTYPES, as_machine

__all__ = ["concurrent", "concurrent_run", "on_groups", "on_groups_run"]


def concurrent(specs: list, *, machine=None, mode: str = "fast") -> list[float]:
    """Run several collectives at the same time on one simulator; -> each one's finish (ns)
    (``concurrent_run`` for the run itself)."""
    result, groups = concurrent_run(specs, machine=machine, mode=mode)
    return [max(result.pe_finish_ps.get(pe, 0) for pe in pes) / 1000 for pes in groups]


def concurrent_run(specs: list, *, machine=None, mode: str = "fast", built: tuple | None = None) -> tuple:
    """Run several collectives at the same time on one simulator; -> (RunResult, each one's PEs).

    ``specs``: dicts with ``kind``, ``group``, ``nbytes`` and optionally ``algo`` (not
    ``auto``), ``op``, ``dtype``, ``packet_bytes``. ``mode="auto"``: coarse when all of them
    together are past one collective's thresholds (``collective._mode``), else fast. The groups must not share a PE (each
    PE's semaphores and buffers belong to one collective); they may share links, HBM
    controllers and routers, and then share their bandwidth. ``built``: ``(grid, kernel,
    programs)`` of the first spec's kernel already built (``line_algo``'s choice), taken as
    it is."""
    machine = as_machine(machine)
    programs: dict = {}
    groups, orders = [], []     # each group's PEs as given, and in its grid's order (renaming's)
    first: dict = {}            # what a collective builds from -> (grid, kernel, programs) of the first
    own = []                    # the specs whose kernels were built here (the others renamed)
    if built is not None:
        first[_key(specs[0])] = built
    for i, spec in enumerate(specs):
        pes = resolve_group(machine, spec["group"])
        taken = set(pes) & set(programs)
        if taken:
            raise CollectiveError(f"collective {i} ({spec['kind']}): PE {min(taken)} is already in another collective")
        grid = make_grid(machine, pes)
        key = _key(spec)
        progs = None
        if key in first:
            # NOTE: as ``collective_units.build``: a group like an earlier one on PEs of the same
            # hardware takes its programs renamed (``collective_rename``), not built again.
            grid0, kernel0, progs0 = first[key]
            progs = progs0 if grid0.pes == grid.pes else \
                rename.programs(machine, progs0, grid0, grid, multicast=not kernel0.multicasts_alike(grid.pes))
        if progs is None:
            kernel = _kernel(machine, i, spec, grid)
            progs = kernel.programs()
            first.setdefault(key, (grid, kernel, progs))
            own.append(i)
        programs.update(progs)
        groups.append(pes)
        orders.append(list(grid.pes))
    if mode == "auto":
        mode = _auto_mode(machine, sum(s["nbytes"] * len(g) for s, g in zip(specs, groups)), programs)
    # NOTE: copies of the first group's programs, each in a unit of its own (a chip), are one
    # unit simulated (``symmetry.images``: ``reduce``'s answer without canonicalising them);
    # renaming maps the grids' PEs position by position, so the grids' orders are compared.
    copies = own in ([], [0]) and all(_key(s) == _key(specs[0]) for s in specs)
    red = symmetry.images(machine, {pe: programs[pe] for pe in orders[0]}, orders) if copies else None
    return run_programs(programs, machine, mode=mode, reduction=red), groups


def _key(spec: dict) -> tuple:
    """What a collective's kernel is built from, besides its group."""
    return (spec["kind"], spec.get("algo", "ring"), spec["nbytes"], spec.get("dtype", "f16"), spec.get("op", "sum"),
            spec.get("packet_bytes"))


def _auto_mode(machine, nbytes: int, programs: dict, busy: dict | None = None) -> str:
    """One collective's ``mode="auto"`` (``collective._mode``) over all the groups' bytes,
    commands and link crossings together (``busy``: their resource load, if known)."""
    busy = model.resource_ps(machine, programs) if busy is None else busy
    return _mode("auto", machine, nbytes, [0], programs, busy)


def _kernel(machine, i: int, spec: dict, grid) -> CollectiveKernel:
    dtype = spec.get("dtype", "f16")
    sched = schedule(spec["kind"], spec.get("algo", "ring"), grid)
    eb = DTYPES[dtype].bytes
    padded = padded_bytes(sched, spec["nbytes"], eb)
    if padded is None:
        raise CollectiveError(f"collective {i} ({spec['kind']}): {spec['nbytes']} bytes do not split into "
                              f"{sched.blocks} equal blocks")
    return CollectiveKernel(machine, sched, grid, padded, eb, dtype, spec.get("op", "sum"), spec.get("packet_bytes"))


def on_groups(kind: str, groups: list, *, nbytes: int, dtype: str = "f16", machine=None) -> tuple[float, str]:
    """(latency ns, algorithm) of ``on_groups_run``."""
    return on_groups_run(kind, groups, nbytes=nbytes, dtype=dtype, machine=machine)[:2]


def on_groups_run(kind: str, groups: list, *, nbytes: int, dtype: str = "f16", machine=None) -> tuple:
    """Collective ``kind`` of ``nbytes`` per member on every group of ``groups`` (disjoint,
    of one size) at once: -> (latency ns, algorithm, RunResult). One group takes the algorithm with
    the least estimate (``algo="auto"``) with its members' blocks in the grid's coordinate
    order (``order="grid"``); several run side by side (``concurrent``), each with the
    algorithm ``line_algo`` picks.

    NOTE: which member of a group holds which shard is the deployment's choice: every shard
    is the same size and every PE does the same work on its own, so only the collectives
    see the order. Torch's rank order would make a 2d reduce-scatter or all-gather over 256
    PEs move each block as its own packet (the blocks a member handles are strided); the
    grid order makes them consecutive, as a kernel laid out for the machine would."""
    if len(groups) == 1:
        run = collective(kind, group=list(groups[0]), nbytes=nbytes, dtype=dtype, algo="auto", machine=machine,
                         order="grid")
        return run.latency_ns, run.algo, run.result
    machine = as_machine(machine)
    algo, first, lines = _line_choice(kind, groups, nbytes, dtype, machine)
    if lines is not None:
        # NOTE: the choice built every line (``collective_units.build``): run those programs.
        programs, busy = lines[2], lines[3]
        mode = _auto_mode(machine, nbytes * sum(len(g) for g in groups), programs, busy)
        result, members = run_programs(programs, machine, mode=mode), groups
    else:
        specs = [dict(kind=kind, group=list(g), nbytes=nbytes, dtype=dtype, algo=algo) for g in groups]
        result, members = concurrent_run(specs, machine=machine, mode="auto", built=first)
    return max(max(result.pe_finish_ps.get(pe, 0) for pe in pes) for pes in members) / 1000, algo, result


def line_algo(kind: str, groups: list, nbytes: int, dtype: str, machine) -> str:
    """The algorithm of several groups side by side:

    - every group inside a chip of its own (they share no link): as one group's
      ``algo="auto"`` chooses (``collective.choose``: the estimates checked against the
      built kernels' bounds);
    - every group across chips (lines of a mesh dimension over a system): every algorithm,
      as ``across:chip`` does (``collective_units.candidates``: the larger of one line's
      estimate and the bound of all lines built together, over their shared links);
    - else (groups sharing one chip) among those whose every step goes from one member to
      one other (``LINE_ALGOS``; ``ring`` if none applies) the least estimate
      (``collective_choice.estimates``) of the first group alone.

    NOTE: a decode step's activations are latency-bound: a ring of n chips takes 2(n - 1)
    network steps, recursive doubling log2 n, and tree wins there either way. A prefill's
    are not, and one line's estimate misses what lines sharing links cost each other:
    Llama-3-70B TP 8's prefill all-reduce across the 8 chips, 36 lines of 932 KB, takes
    122.7 us by tree (the least one-line estimate) and 57.8 us by hier (chosen with the
    lines' bound; 2d 87.0, bidir-ring 84.3, direct 110.9); its all-gather 64.6 -> 28.6 us,
    reduce-scatter 56.2 -> 34.2. Inside chips (TP 8's 252 KiB reduce-scatter over each
    chip's 36 tiles): 2d 2.7 us against ring 3.9; a prefill's 32 MiB, ring 182 us, where
    2d's estimate is as low as ring's and it takes 488."""
    return _line_choice(kind, groups, nbytes, dtype, machine)[0]


def _line_choice(kind: str, groups: list, nbytes: int, dtype: str, machine) -> tuple:
    """(``line_algo``'s algorithm, (grid, kernel, programs) of the first group's kernel when
    the choice built it inside chips, ``collective_units.build``'s tuple of every line when
    it built them across chips); None for what it did not build."""
    lines = [tuple(resolve_group(machine, list(g))) for g in groups]
    grid = make_grid(machine, lines[0])
    chips = [{machine.chip_of(pe) for pe in g} for g in lines]
    eb = DTYPES[dtype].bytes
    cands = estimates(kind, machine, grid, nbytes, eb)
    if all(len(c) == 1 for c in chips) and len(set().union(*chips)) == len(groups):
        if not cands:
            return "ring", None, None
        algo, _, kernel, programs = choose(kind, machine, grid, nbytes, eb, dtype, "sum", 0, None, "rank", cands)[:4]
        return algo, (grid, kernel, programs), None
    per = eb * (len(grid.pes) if kind in units.BLOCKED else 1)
    if all(len(c) > 1 for c in chips) and nbytes % per == 0:
        built = units.candidates(kind, machine, lines, [nbytes // per] * len(lines), eb, dtype, "sum", 0, None,
                                 "rank", _build, estimates)
        if built:
            algo = min(built, key=lambda a: (built[a][0], ALGOS.index(a)))
            return algo, None, built[algo][1]
    est = {a: ps for a, ps in cands.items() if a in LINE_ALGOS}
    return (min(est, key=est.get) if est else "ring"), None, None


#: Algorithms run on several groups at once.
LINE_ALGOS = ("ring", "bidir-ring", "tree")
