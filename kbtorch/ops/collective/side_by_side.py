"""Several collectives at once on one simulator: groups of PEs side by side (the device's
redistributions over every line of a mesh), sharing links, HBM controllers and routers.
"""
from __future__ import annotations

from ...kernel import fast_forward, run_programs, steady
from ...kernel.door import symmetry
from ...kernel.policy import collective_mode
from ..contract import DTYPES, as_machine
from . import analytic
from . import rename
from .build import Built
from .choice import choose
from .groups import make_grid, resolve_group
from .kernel import CollectiveKernel
from .kernel_layout import padded_bytes
from .request import CollectiveError, Request
from .schedules import schedule
from .simulate import collective

__all__ = ["concurrent", "concurrent_run", "on_groups", "on_groups_run"]


def concurrent(specs: list, *, machine=None, mode: str = "fast") -> list[float]:
    """Run several collectives at the same time on one simulator; -> each one's finish (ns)
    (``concurrent_run`` for the run itself)."""
    result, groups = concurrent_run(specs, machine=machine, mode=mode)
    return [max(result.pe_finish_ps.get(pe, 0) for pe in pes) / 1000 for pes in groups]


def concurrent_run(specs: list, *, machine=None, mode: str = "fast", built: Built | None = None,
                   fidelity: str | None = None) -> tuple:
    """Run several collectives at the same time on one simulator; -> (RunResult, each one's PEs).

    ``specs``: dicts with ``kind``, ``group``, ``nbytes`` and optionally ``algo`` (not
    ``auto``), ``op``, ``dtype``, ``packet_bytes``. ``mode="auto"``: coarse when all of them
    together are past one collective's thresholds (``kernel.policy.collective_mode``), else
    fast. The groups must not share a PE (each PE's semaphores and buffers belong to one
    collective); they may share links, HBM controllers and routers, and then share their
    bandwidth. ``built``: the first spec's kernel already built (``line_algo``'s choice),
    taken as it is. ``fidelity="auto"`` (None: the one in force): collectives all alike
    (one kind, algorithm, size, dtype, reduction, packet) have their steady rounds
    fast-forwarded together (``kernel.steady``); any other mix is simulated whole."""
    machine = as_machine(machine)
    try:
        fidelity = steady.check(fidelity)
    except ValueError as exc:
        raise CollectiveError(str(exc)) from None
    programs, groups, red, kernels = _joined(machine, specs, built)
    if mode == "auto":
        mode = _auto_mode(machine, sum(s["nbytes"] * len(g) for s, g in zip(specs, groups)), programs)
    # NOTE: only collectives alike (one kernel, its rounds in step): truncating unlike ones
    # alike would move where one ends against the others' rounds, a change of the mix.
    rounds = {k.rounds for k in kernels}
    if fidelity == "auto" and len(rounds) == 1 and len({_key(s) for s in specs}) == 1:
        def run_at(q):
            progs, _, red_q, _ = _joined(machine, specs, None, q)
            return run_programs(progs, machine, mode=mode, reduction=red_q)
        got = fast_forward(run_at, rounds.pop() - 1, fidelity)
        if got is not None:
            got.programs = programs
            return got, groups
    return steady.simulated(run_programs(programs, machine, mode=mode, reduction=red), fidelity), groups


def _joined(machine, specs: list, built: Built | None, rounds: int | None = None) -> tuple:
    """(every group's programs together, the groups' PEs, the symmetry reduction of copies or
    None, the kernels built), each kernel truncated to ``rounds`` (``KernelLayout.truncate``;
    None: whole)."""
    programs: dict = {}
    groups, orders = [], []     # each group's PEs as given, and in its grid's order (renaming's)
    first: dict = {}            # what a collective builds from -> (grid, kernel, programs) of the first
    own, kernels = [], []       # the specs whose kernels were built here (the others renamed); each one's kernel
    if built is not None:
        first[_key(specs[0])] = (built.grids[0], built.kernels[0], built.programs)
    for i, spec in enumerate(specs):
        pes = resolve_group(machine, spec["group"])
        taken = set(pes) & set(programs)
        if taken:
            raise CollectiveError(f"collective {i} ({spec['kind']}): PE {min(taken)} is already in another collective")
        grid = make_grid(machine, pes)
        key = _key(spec)
        progs = None
        if key in first:
            # NOTE: as ``build.build_lines``: a group like an earlier one on PEs of the same
            # hardware takes its programs renamed (``rename``), not built again.
            grid0, kernel0, progs0 = first[key]
            progs = progs0 if grid0.pes == grid.pes else \
                rename.programs(machine, progs0, grid0, grid, multicast=not kernel0.multicasts_alike(grid.pes))
            kernels.append(kernel0)
        if progs is None:
            kernel = _kernel(machine, i, spec, grid)
            if rounds is not None:
                kernel.truncate(rounds)
            progs = kernel.programs()
            first.setdefault(key, (grid, kernel, progs))
            own.append(i)
            kernels.append(kernel)
        programs.update(progs)
        groups.append(pes)
        orders.append(list(grid.pes))
    # NOTE: copies of the first group's programs, each in a unit of its own (a chip), are one
    # unit simulated (``symmetry.images``: ``reduce``'s answer without canonicalising them);
    # renaming maps the grids' PEs position by position, so the grids' orders are compared.
    copies = own in ([], [0]) and all(_key(s) == _key(specs[0]) for s in specs)
    red = symmetry.images(machine, {pe: programs[pe] for pe in orders[0]}, orders) if copies else None
    return programs, groups, red, kernels


def _key(spec: dict) -> tuple:
    """What a collective's kernel is built from, besides its group."""
    return (spec["kind"], spec.get("algo", "ring"), spec["nbytes"], spec.get("dtype", "f16"), spec.get("op", "sum"),
            spec.get("packet_bytes"))


def _auto_mode(machine, nbytes: int, programs: dict, busy: dict | None = None) -> str:
    """One collective's ``mode="auto"`` (``kernel.policy.collective_mode``) over all the groups' bytes,
    commands and link crossings together (``busy``: their resource load, if known)."""
    busy = analytic.resource_ps(machine, programs) if busy is None else busy
    return collective_mode("auto", machine, nbytes, programs, busy)


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
    choice = choose(Request(kind, machine, nbytes=nbytes, dtype=dtype), _lines(machine, groups), side_by_side=True)
    if choice.built is not None and len(choice.built.grids) == len(groups):
        # NOTE: the choice built every line (``build.build_lines``): run those programs.
        programs, busy = choice.built.programs, choice.built.busy
        mode = _auto_mode(machine, nbytes * sum(len(g) for g in groups), programs, busy)
        result, members = run_programs(programs, machine, mode=mode), groups
    else:
        specs = [dict(kind=kind, group=list(g), nbytes=nbytes, dtype=dtype, algo=choice.algo) for g in groups]
        result, members = concurrent_run(specs, machine=machine, mode="auto", built=choice.built)
    return max(max(result.pe_finish_ps.get(pe, 0) for pe in pes) for pes in members) / 1000, choice.algo, result


def line_algo(kind: str, groups: list, nbytes: int, dtype: str, machine) -> str:
    """The algorithm of several groups side by side (``choice.choose``'s, ``side_by_side``)."""
    return choose(Request(kind, machine, nbytes=nbytes, dtype=dtype), _lines(machine, groups), side_by_side=True).algo


def _lines(machine, groups: list) -> list:
    return [tuple(resolve_group(machine, list(g))) for g in groups]
