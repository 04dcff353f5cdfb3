"""Shared composite reads: a gang of PEs reads each tile of an operand once and multicasts it.

A read ``Move`` with a ``Share`` (``sim.commands``) is the same move in the composites of
every member of its gang. Tile ``i`` is read once, by member ``pes[i % len(pes)]`` (the
readers rotate, so each member's DMA engine issues its share of the requests), from that
member's ``Move.loc``, and travels down the multicast tree to every member's staging slot.
It starts when the last member's read stage takes tile ``i``: every member's buffer for the
tile is then free (the receivers' credits); each member's read of tile ``i`` is done when its
own copy lands, and every member's read unit is free again once the request has left.
"""
from __future__ import annotations

from ..commands import Loc


class _Join:
    __slots__ = ("run", "src", "stride", "dst", "on_done", "on_sent", "nbytes")

    def __init__(self, run, src, stride, dst, on_done, on_sent, nbytes):
        self.run, self.src, self.stride, self.dst, self.on_done, self.on_sent = run, src, stride, dst, on_done, on_sent
        self.nbytes = nbytes


class Gangs:
    """The shared reads of one run that wait for members, by ``(share key, gang, tile)``."""

    def __init__(self, sim):
        self.sim = sim
        self.waiting: dict = {}

    def join(self, run, move, i: int, dst: Loc, on_done, on_sent, now: int, chain) -> None:
        """Composite ``run``'s read stage takes tile ``i`` of shared ``move``."""
        share = move.share
        pe = run.pe.info.id
        if pe not in share.pes:
            raise ValueError(f"PE {pe} {run.cmd.describe()}: share '{share.key}' does not list it (gang {share.pes})")
        key = (share.key, share.pes, i)
        joined = self.waiting.setdefault(key, {})
        if joined and next(iter(joined.values())).nbytes != move.nbytes:
            raise ValueError(f"PE {pe} {run.cmd.describe()}: share '{share.key}' tile {i} is {move.nbytes} bytes here, "
                             f"{next(iter(joined.values())).nbytes} at another member")
        if pe in joined:
            raise ValueError(f"PE {pe} {run.cmd.describe()}: share '{share.key}' tile {i} joined twice")
        src = Loc(move.loc.node, move.loc.addr + i * move.step)
        joined[pe] = _Join(run, src, move.stride, dst, on_done, on_sent, move.nbytes)
        if len(joined) < len(share.pes):
            return
        del self.waiting[key]
        members = [joined[p] for p in share.pes]
        reader = members[i % len(members)]
        info = reader.run.pe.info

        def sent(t, c):
            for m in members:
                m.on_sent(t, c)

        self.sim.dma.multicast(info.node("dma_rd"), info.node("tcm"), reader.src, tuple(m.dst for m in members),
                               move.nbytes, now, chain, [m.on_done for m in members], None, sent,
                               f"{reader.run.cmd.describe()} tile {i} multicast", reader.stride)

    def stuck(self) -> list[str]:
        """The shared reads some members never joined."""
        return [f"share '{key}' tile {i}: joined by PEs {sorted(j)} only (gang {pes})"
                for (key, pes, i), j in sorted(self.waiting.items())]
