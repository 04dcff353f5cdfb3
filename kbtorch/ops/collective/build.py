"""A collective's kernel built: for one group (``build``) or for every line of a collective
across units (``build_lines``), with the models the choice and the report need (``Built``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from . import analytic
from . import rename
from .groups import make_grid
from .kernel import CollectiveKernel
from .kernel_layout import padded_bytes
from .request import CollectiveError, Request
from .schedules import schedule
from .steps import Schedule

#: Kinds whose per-member buffer is one block per member (a line's share is per block).
BLOCKED = ("all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class Built:
    """One algorithm built: its schedule, the grid and kernel of every line (one for a
    group), all their programs (``{pe: [commands]}``), the busy ps per resource of those
    programs (``analytic.resource_ps``) and the startup ps (alpha_min, the lines' largest)."""

    sched: Schedule
    grids: tuple
    kernels: tuple
    programs: dict
    busy: dict
    startup: int

    @property
    def bound(self) -> int:
        """The speed of light: the larger of the startup and the busiest resource."""
        return max(self.startup, max(self.busy.values()))


def build(req: Request, grid) -> Built:
    """``req.algo`` (not ``auto``) over the members of ``grid``, ``req.nbytes`` each."""
    machine, eb = req.machine, req.elem_bytes
    sched = schedule(req.kind, req.algo, grid, req.root, req.order)
    padded = padded_bytes(sched, req.nbytes, eb)
    if padded is None:
        raise CollectiveError(f"{req.algo} {req.kind}: {req.nbytes} bytes per member ({req.nbytes // eb} elements "
                              f"of {eb} bytes) do not split into {sched.blocks} equal blocks")
    kernel = CollectiveKernel(machine, sched, grid, padded, eb, req.dtype, req.op, req.packet_bytes)
    if req.rounds is not None:
        kernel.truncate(req.rounds)
    programs = kernel.programs()
    # NOTE: the bound's packet is one piece of one block: a kernel that sent blocks one by one
    # would not wait for a whole packet of several blocks.
    startup = analytic.startup_ps(machine, sched, grid.pes, min(kernel.packet_elems, kernel.block_elems) * eb)
    return Built(sched, (grid,), (kernel,), programs, analytic.resource_ps(machine, programs), startup)


def build_lines(req: Request, lines: list, sizes: list) -> Built:
    """``req.algo`` on every line (PE tuples) of a collective across units, line ``t``
    carrying ``sizes[t]`` elements of each member's block (``units.shares``).

    NOTE: a line of the same share as an earlier one, on PEs of the same hardware (see
    ``rename``), takes that line's programs renamed to its own PEs instead of being built
    again: the kernel's commands depend only on the schedule, the share and the PEs' own
    memories, so the renamed programs are the ones a build would give (tested)."""
    machine, eb = req.machine, req.elem_bytes
    programs, grids, kernels, startup, sched, first = {}, [], [], 0, None, {}
    for pes, u in zip(lines, sizes):
        grid = make_grid(machine, pes)
        progs = None
        if u in first:
            grid0, sched, kernel, progs0 = first[u]
            progs = rename.programs(machine, progs0, grid0, grid, multicast=not kernel.multicasts_alike(grid.pes))
        if progs is not None:
            st = analytic.startup_ps(machine, sched, grid.pes, min(kernel.packet_elems, kernel.block_elems) * eb)
        else:
            nbytes = u * eb * (len(pes) if req.kind in BLOCKED else 1)
            one = build(replace(req, nbytes=nbytes), grid)
            sched, kernel, progs, st = one.sched, one.kernels[0], one.programs, one.startup
            first.setdefault(u, (grid, sched, kernel, progs))
        programs.update(progs)
        grids.append(grid)
        kernels.append(kernel)
        startup = max(startup, st)
    return Built(sched, tuple(grids), tuple(kernels), programs, analytic.resource_ps(machine, programs), startup)

