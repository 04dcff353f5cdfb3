"""A collective's kernel built: for one group (``build``) or for every line of a collective
across units (``build_lines``), with the models the choice and the report need (``Built``),
and the simulation mode of ``mode="auto"`` (``pick_mode``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..contract import sim_mode
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


def pick_mode(mode: str, machine, moved: int, programs: dict, busy: dict) -> str:
    """The simulation mode of ``mode="auto"``: coarse when the collective moves more than
    ``COARSE_BYTES`` in all (``moved``: nbytes x members, times 3), its kernel has more than
    ``COARSE_COMMANDS`` commands or its traffic crosses links more than
    ``contract.COARSE_FLIT_HOPS`` times (``busy``: its resource load, ``sim_mode``), else
    fast; an explicit mode as given."""
    big = 3 * moved > COARSE_BYTES or sum(len(c) for c in programs.values()) > COARSE_COMMANDS
    return sim_mode(mode, machine, programs, busy, big)
