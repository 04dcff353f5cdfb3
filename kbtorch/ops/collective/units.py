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
(``kernel_layout.sprayed_reductions``).
"""
from __future__ import annotations

import torch

from .build import BLOCKED
from .groups import level_instances, levels_of, make_grid
from .kernel_layout import padded_bytes
from .request import CollectiveError, Request
from .schedules import pad, reference, schedule


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


def lines_of(req: Request) -> tuple[str, list, list]:
    """(level, lines, shares) of ``req`` across units: line ``t`` is PE ``t`` of every unit
    (PE tuples), carrying ``shares[t]`` elements of each member's block (``shares``); lines
    without a share are left out."""
    level, want = parse(req.group)
    found = units(req.machine, level, want)
    n, k = len(found), len(found[0])
    lines = [tuple(u[t] for u in found) for t in range(k)]
    sizes = shares(req.kind, req.nbytes // req.elem_bytes, n, k)
    return level, lines[:len(sizes)], sizes


def numerics(req: Request, lines: list, sizes: list) -> list:
    """Each unit's output (of ``req.shards``, by ``req.algo``): the lines' reference outputs
    on their shares, put back together."""
    kind, shards = req.kind, req.shards
    n = len(shards)
    flat = [s.reshape(-1) for s in shards]
    u = sum(sizes)
    outs, off = [], 0
    for pes, ut in zip(lines, sizes):
        sched = schedule(kind, req.algo, make_grid(req.machine, pes), req.root, req.order)
        if kind in ("reduce_scatter", "all_to_all"):
            ins = [f.reshape(n, u)[:, off:off + ut].reshape(-1) for f in flat]
        else:
            ins = [f[off:off + ut] for f in flat]
        outs.append(_line_outputs(req, sched, ins, ut))
        off += ut
    if kind in ("all_gather", "all_to_all"):
        return [torch.cat([o[m].reshape(n, -1) for o in outs], dim=1).reshape(-1) for m in range(n)]
    return [torch.cat([o[m] for o in outs]) for m in range(n)]


def _line_outputs(req: Request, sched, inputs: list, ut: int) -> list:
    """One line's outputs on its share ``ut``, padded as the kernel runs."""
    eb = req.elem_bytes
    nbytes = ut * eb * (sched.n if req.kind in BLOCKED else 1)
    padded = padded_bytes(sched, nbytes, eb)
    if req.kind != "all_to_all" and padded != nbytes:
        inputs = pad(inputs, padded, req.op)
    count = nbytes // eb
    return [o[:count] for o in reference(sched, inputs, req.op)]
