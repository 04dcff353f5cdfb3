"""Collectives whose members are units of PEs (chips): ``group="across:chip"`` or ``"across:chip:K"``.

A chip of a system is one member of a collective between chips (the paper's Fig. 8: an
all-gather of each chip's buffer over 8 chips), but its data moves through all of its PEs:
PE ``t`` of every chip forms line ``t``, and each line runs the collective on its share of
every member's buffer, all lines at once on one simulator (sharing the chips' ports, links
and HBM). ``nbytes`` is per unit (per chip), counted as nccl-tests does.

A unit's buffer is cut per line so that line ``t`` carries share ``t`` of every block: the
per-member block of an all-gather, reduce-scatter or all-to-all (``u`` elements) is split
into ``k`` near-equal pieces, one per line, and so is the whole buffer of an all-reduce or
broadcast. The unit's output is the lines' outputs put back block by block, so it equals
the collective over the units' whole buffers (checked against torch in the tests).

``across:chip:K`` uses ``K`` PEs of each chip, evenly spaced (PE ``t * size // K`` of the
chip), as the engines that drive its network: fewer lines, fewer trains to simulate.
NOTE: a chip's network is driven by its DMA engines, not by every core; K PEs whose DMA ports
together exceed the chip's port bandwidth move the same bytes in the same time (Maia 200:
4 tiles x 512 GB/s > 1400 GB/s of ANCs). A reduction crosses its tile's NoC link more than a
copy; on a sprayed machine the kernel keeps that below the ports' share
(``collective_layout.sprayed_reductions``).
"""
from __future__ import annotations

import torch

from ..kernel import run_programs
from . import collective_model as model
from . import collective_rename as rename
from .collective_group import level_instances, levels_of, make_grid
from .collective_plan import ALGOS, CollectiveError, reference, schedule

BLOCKED = ("all_gather", "reduce_scatter", "all_to_all")


def parse(group: str) -> tuple[str, int | None]:
    """``across:LEVEL[:K]`` -> (LEVEL, K or None for every PE)."""
    _, _, rest = group.partition(":")
    level, _, k = rest.partition(":")
    if k and (not k.isdigit() or int(k) < 1):
        raise CollectiveError(f"group '{group}': K in across:{level}:K must be a positive integer")
    return level, int(k) if k else None


def units(machine, level: str, k: int | None = None) -> list:
    """The PE ids of every instance of ``level`` (``chip``), in order; all of one size; only
    ``k`` of each, evenly spaced, if given."""
    known = levels_of(machine)
    if level not in known:
        raise CollectiveError(f"group 'across:{level}': unknown level on topology '{machine.name}' "
                              f"(known: {', '.join(known)})")
    out = list(level_instances(machine, level).values())
    if len(out) < 2:
        raise CollectiveError(f"group 'across:{level}': topology '{machine.name}' has one {level}")
    if len({len(u) for u in out}) != 1:
        raise CollectiveError(f"group 'across:{level}': the {level}s have different PE counts")
    size = len(out[0])
    if k is not None and k > size:
        raise CollectiveError(f"group 'across:{level}:{k}': a {level} has {size} PEs")
    return out if k is None else [[u[t * size // k] for t in range(k)] for u in out]


def shares(kind: str, unit_elems: int, n: int, k: int) -> list[int]:
    """Elements of a member's per-block share that each of ``k`` lines carries."""
    if kind in ("reduce_scatter", "all_to_all") and unit_elems % n:
        raise CollectiveError(f"{kind}: {unit_elems} elements per unit do not split into {n} equal blocks")
    u = unit_elems // n if kind in ("reduce_scatter", "all_to_all", "all_gather") else unit_elems
    if kind == "all_gather" and unit_elems % n:
        raise CollectiveError(f"all_gather: the gathered {unit_elems} elements do not split into {n} equal shards")
    return [x for x in (u // k + (t < u % k) for t in range(k)) if x]


def build(kind, algo, machine, lines, sizes, eb, dtype, op, root, packet_bytes, order, build_one):
    """(schedule, kernels, merged programs, busy ps per resource, startup ps) of ``algo`` on
    every line (``build_one``: collective._build for one grid).

    NOTE: a line of the same share as an earlier one, on PEs of the same hardware (see
    ``collective_rename``), takes that line's programs renamed to its own PEs instead of
    being built again: the kernel's commands depend only on the schedule, the share and the
    PEs' own memories, so the renamed programs are the ones a build would give (tested)."""
    programs, kernels, startup, sched, first = {}, [], 0, None, {}
    for pes, u in zip(lines, sizes):
        grid = make_grid(machine, pes)
        nbytes = u * eb * (len(pes) if kind in BLOCKED else 1)
        progs = None
        if u in first:
            grid0, sched, kernel, progs0 = first[u]
            progs = rename.programs(machine, progs0, grid0, grid, multicast=not kernel.multicasts_alike(grid.pes))
        if progs is not None:
            st = model.startup_ps(machine, sched, grid.pes, min(kernel.packet_elems, kernel.block_elems) * eb)
        else:
            sched, kernel, progs, _, st = build_one(kind, algo, machine, grid, nbytes, eb, dtype, op, root,
                                                    packet_bytes, order)
            first.setdefault(u, (grid, sched, kernel, progs))
        programs.update(progs)
        kernels.append(kernel)
        startup = max(startup, st)
    return sched, kernels, programs, model.resource_ps(machine, programs), startup


def candidates(kind, machine, lines, sizes, eb, dtype, op, root, packet_bytes, order, build_one, estimate_one) -> dict:
    """``{algo: (estimate ps, built)}``: the estimate is the larger of one line's alpha-beta
    (``estimate_one``: collective_choice.estimates) and the bound of all lines together (their
    shared links). NOTE: algorithms are built in the order of their one-line estimates and
    the search stops where that estimate alone reaches the best so far (it cannot win)."""
    nbytes0 = sizes[0] * eb * (len(lines[0]) if kind in BLOCKED else 1)
    alone = estimate_one(kind, machine, make_grid(machine, lines[0]), nbytes0, eb, root, packet_bytes, order)
    out, best = {}, None
    for algo in sorted(alone, key=lambda a: (alone[a], ALGOS.index(a))):
        if best is not None and alone[algo] >= best:
            break
        try:
            built = build(kind, algo, machine, lines, sizes, eb, dtype, op, root, packet_bytes, order, build_one)
        except CollectiveError:
            continue
        busy, startup = built[3], built[4]
        out[algo] = (max(alone[algo], startup, max(busy.values())), built)
        best = out[algo][0] if best is None else min(best, out[algo][0])
    return out


def run(kind, group, algo, machine, nbytes, eb, dtype, op, root, packet_bytes, mode, order, build_one, pick_mode,
        estimate_one):
    """Simulate the collective across units; -> (algo, lines, shares, built, result, mode, candidates ps)."""
    level, want = parse(group)
    found = units(machine, level, want)
    n, k = len(found), len(found[0])
    lines = [tuple(u[t] for u in found) for t in range(k)]
    sizes = shares(kind, nbytes // eb, n, k)
    lines = lines[:len(sizes)]
    if algo == "auto":
        cands = candidates(kind, machine, lines, sizes, eb, dtype, op, root, packet_bytes, order, build_one,
                           estimate_one)
        if not cands:
            raise CollectiveError(f"{kind}: no algorithm applies to {nbytes} bytes over {n} {level}s")
        algo = min(cands, key=lambda a: (cands[a][0], ALGOS.index(a)))
        built = cands[algo][1]
        cands = {a: ps for a, (ps, _) in cands.items()}
    else:
        built, cands = build(kind, algo, machine, lines, sizes, eb, dtype, op, root, packet_bytes, order,
                             build_one), {}
    programs, busy = built[2], built[3]
    mode = pick_mode(mode, machine, nbytes, [p for ln in lines for p in ln], programs, busy)
    return algo, lines, sizes, built, run_programs(programs, machine, mode=mode), mode, cands


def numerics(kind, algo, machine, lines, sizes, shards, op, root, order, pad) -> list:
    """Each unit's output: the lines' reference outputs on their shares, put back together."""
    n = len(shards)
    flat = [s.reshape(-1) for s in shards]
    u = sum(sizes)
    outs, off = [], 0
    for pes, ut in zip(lines, sizes):
        sched = schedule(kind, algo, make_grid(machine, pes), root, order)
        if kind in ("reduce_scatter", "all_to_all"):
            ins = [f.reshape(n, u)[:, off:off + ut].reshape(-1) for f in flat]
        else:
            ins = [f[off:off + ut] for f in flat]
        outs.append(pad(sched, ins, ut))
        off += ut
    if kind in ("all_gather", "all_to_all"):
        return [torch.cat([o[m].reshape(n, -1) for o in outs], dim=1).reshape(-1) for m in range(n)]
    return [torch.cat([o[m] for o in outs]) for m in range(n)]


def line_reference(kind: str, op: str, eb: int, padded_of, pad_fn):
    """``pad(sched, inputs, share)`` for ``numerics``: one line's outputs, padded as the kernel runs."""
    def run_line(sched, inputs, ut):
        nbytes = ut * eb * (sched.n if kind in BLOCKED else 1)
        padded = padded_of(sched, nbytes, eb)
        if kind != "all_to_all" and padded != nbytes:
            inputs = pad_fn(inputs, padded, op)
        count = nbytes // eb
        return [o[:count] for o in reference(sched, inputs, op)]
    return run_line
