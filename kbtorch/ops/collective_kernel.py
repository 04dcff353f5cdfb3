"""The collective tile kernel: a schedule (``collective_plan``) turned into PE commands.

Buffers (per member, in its PE's HBM slice): ``IN`` (the input), ``OUT`` (the output; an
all-gather or broadcast works in place there) and, where a value must rest between steps,
two ``SCRATCH`` regions used alternately by version. In TCM: a composite staging area and
``slots`` receive slots per member that sends reduction data to this one.

Every block is cut into packets of at most ``packet_bytes``; each packet moves on its own,
so steps pipeline packet by packet. Per packet of a transfer:

- reduce: the sender DMAs its value into a free receive slot of the receiver, with a remote
  semaphore increment of that slot (Maia's send with remote increment). The receiver runs
  one MATH composite: DMA_READ its own value (HBM) -> FETCH own + received -> add/max ->
  STORE -> DMA_WRITE the result. Where the result goes next is decided by looking ahead:
  straight into the next receiver's slot (fused forward), into the next receivers' ``OUT``
  (fused copy), and into its own ``OUT``/``SCRATCH`` if it is kept or needed later. After
  the composite the receiver returns a credit over IPCQ; a sender reuses a slot only after
  the credit for its previous use has arrived.
- copy: the value is written into the receiver's ``OUT`` (a DMA, or fused into the
  composite that produced it), with a remote increment of the receiver's version semaphore.

Semaphores: ``x{src}.{slot}`` (arrivals in a slot), ``c{dst}`` (credits from a receiver),
``k{src}`` (slot of that sender consumed), ``v{block}.{packet}`` (versions of a value in HBM).
Waits on arrivals, credits and versions use absolute thresholds without decrement, so they
hold whatever engine the matching signal comes from.
"""
from __future__ import annotations

from ..kernel.api import PEContext
from ..sim.commands import Loc, Move, Signal, Wait
from .collective_plan import CollectiveError, Schedule

ROUND = 4
SLOTS = 2 * ROUND + 1
MAX_WRITES = 3
MAX_PACKET = 2**20
#: Up to this many bytes per member, values between steps stay in a TCM buffer instead of
#: HBM scratch (small collectives are latency-bound: no HBM round trip per step).
TCM_VALUES = 256 * 1024


def packet_size(block_bytes: int) -> int:
    """Default packet: a quarter block, at least 64 KiB and at most 1 MiB (before the TCM
    limit). NOTE: each packet is one composite of one tile; consecutive composites stream
    through the MATH engine's stage units, so more packets pipeline as tiles would."""
    return min(block_bytes, max(64 * 1024, min(MAX_PACKET, block_bytes // 4)))


def _align(n: int) -> int:
    return -(-n // 4096) * 4096


class CollectiveKernel:
    """Builds ``{pe: [commands]}`` for ``sched`` on ``grid`` with ``nbytes`` per member."""

    def __init__(self, machine, sched: Schedule, grid, nbytes: int, elem_bytes: int, dtype: str, op: str,
                 packet_bytes: int | None = None, slots: int = SLOTS):
        self.m, self.s, self.grid, self.eb, self.dtype = machine, sched, grid, elem_bytes, dtype
        self.math_op = {"sum": "add", "max": "max"}[op]
        self.slots = slots
        elems = nbytes // elem_bytes
        if nbytes % elem_bytes or elems % sched.blocks:
            raise CollectiveError(f"{sched.algo} {sched.kind}: {nbytes} bytes per member ({elems} elements of "
                                  f"{elem_bytes} bytes) do not split into {sched.blocks} equal blocks")
        self.nbytes, self.block_elems = nbytes, elems // sched.blocks
        self.ctx = [PEContext(machine, f"{sched.kind} {sched.algo}", pe, grid.pes) for pe in grid.pes]
        self.uses = self._uses()
        self.chan_in = self._channels()
        self.packet_elems = self._packet_elems(packet_bytes)
        self.pieces = [(k, min(self.packet_elems, self.block_elems - k)) for k in range(0, self.block_elems, self.packet_elems)]
        self._layout()

    # ---- analysis of the schedule -------------------------------------------------------
    def _uses(self) -> dict:
        """(member, block) -> [(step, role, xfer)] in program order (sends before receives
        within a step: a send reads the value from before the step)."""
        uses: dict = {}
        for k, step in enumerate(self.s.steps):
            for role in (0, 1):
                for x in step:
                    for b in x.blocks:
                        uses.setdefault((x.src if role == 0 else x.dst, b), []).append((k, role, x))
        return uses

    def _channels(self) -> list:
        """Per receiver, its senders of reduction data -> slot channel index."""
        chan_in = [dict() for _ in range(self.s.n)]
        for step in self.s.steps:
            for x in step:
                if x.reduce:
                    chan_in[x.dst].setdefault(x.src, len(chan_in[x.dst]))
        return chan_in

    def _packet_elems(self, packet_bytes) -> int:
        cap = self.ctx[0].arena.capacity
        chans = max(len(c) for c in self.chan_in) or 1
        fit = (cap - 4096) // (chans * self.slots + 4) // 256 * 256
        want = packet_bytes or packet_size(self.block_elems * self.eb)
        elems = max(1, min(want, fit) // self.eb)
        if packet_bytes and packet_bytes > fit:
            raise CollectiveError(f"packet_bytes={packet_bytes}: {chans} receive channels x {self.slots} slots "
                                  f"do not fit the TCM ({cap} bytes); at most {fit}")
        return min(elems, self.block_elems)

    def _layout(self) -> None:
        s, eb = self.s, self.eb
        self.block_bytes = self.block_elems * eb
        out_bytes = self.nbytes // s.n if s.kind == "reduce_scatter" else self.nbytes
        self.in0 = 0
        self.out0 = _align(self.nbytes) if s.kind in ("all_reduce", "reduce_scatter") else 0
        self.scr0 = self.out0 + _align(out_bytes)
        hbm = self.m.node(self.m.pes[self.grid.pes[0]].hbm)["params"]
        need = self.scr0 + 2 * _align(self.nbytes)
        cap = int(hbm.get("capacity_gib", 0) * 2**30)
        if cap and need > cap:
            raise CollectiveError(f"{s.kind}: {self.nbytes} bytes per member need {need} bytes of HBM "
                                  f"(input, output, 2 scratch); a PE's slice has {cap}")
        self.in_tcm = self.nbytes <= TCM_VALUES
        self.slot0, self.val0 = [], []
        for r, ctx in enumerate(self.ctx):
            ctx.tcm("staging", 4 * self.packet_elems * eb)
            if self.chan_in[r]:
                self.slot0.append(ctx.tcm("receive slots", len(self.chan_in[r]) * self.slots * self.packet_elems * eb).addr)
            else:
                self.slot0.append(0)
            self.val0.append(ctx.tcm("values", self.nbytes).addr if self.in_tcm else 0)

    # ---- addresses ----------------------------------------------------------------------
    def hbm(self, r: int, region: str, b: int, k: int) -> Loc:
        node = self.m.pes[self.grid.pes[r]].hbm
        if region == "in":
            return Loc(node, self.in0 + (b * self.block_elems + k) * self.eb)
        if region == "tcm":
            return Loc(self.m.pes[self.grid.pes[r]].node("tcm"), self.val0[r] + (b * self.block_elems + k) * self.eb)
        if region == "out":
            idx = self.s.keeps[r].index(b) if self.s.kind == "reduce_scatter" else b
            return Loc(node, self.out0 + (idx * self.block_elems + k) * self.eb)
        return Loc(node, self.scr0 + int(region[-1]) * _align(self.nbytes) + (b * self.block_elems + k) * self.eb)

    def slot(self, src: int, dst: int, use: int) -> tuple[Loc, int]:
        """(TCM address, slot number) of use ``use`` of channel src -> dst."""
        i = self.chan_in[dst][src] * self.slots + use % self.slots
        return Loc(self.m.pes[self.grid.pes[dst]].node("tcm"), self.slot0[dst] + i * self.packet_elems * self.eb), i

    # ---- emission -----------------------------------------------------------------------
    def _order(self):
        """(round, step index, step, piece) in emission order.

        NOTE: pieces are taken in rounds of ``ROUND``; inside a round every step runs for all
        its pieces before the next step (so consecutive composites stream), rounds follow
        each other (NCCL's chunk loop). Every wait points to an earlier (round, step) or to
        an earlier command of the same engine queue, so no schedule can deadlock: a fused
        forward that needs a credit is only fused if that credit is for a slot use of an
        earlier (round, step) (see ``_can_fuse``).
        """
        for r0 in range(0, len(self.pieces), ROUND):
            for k, step in enumerate(self.s.steps):
                yield r0 // ROUND, k, step, self.pieces[r0:r0 + ROUND]

    def programs(self) -> dict:
        """``{pe: [commands]}`` of the whole collective."""
        s = self.s
        home = "in" if s.kind in ("all_reduce", "reduce_scatter") else "out"
        self.where = {(r, b, k0): (home, 0) for r in range(s.n) for b in s.holds[r] for k0, _ in self.pieces}
        self.fused: set = set()
        self._use_indices()
        for rnd, k, step, pieces in self._order():
            for k0, ne in pieces:
                for x in step:
                    for b in x.blocks:
                        if (id(x), b, k0) not in self.fused:
                            self._send(k, x, b, k0, ne)
            for k0, ne in pieces:
                for x in step:
                    for b in x.blocks:
                        self._receive((rnd, k), x, b, k0, ne)
        for r in range(s.n):
            for b in s.keeps[r]:
                if self.where.get((r, b, 0), ("",))[0] != "out":
                    raise AssertionError(f"{s.algo}: member {r} block {b} did not reach OUT")
        return {ctx.pe: ctx.commands for ctx in self.ctx}

    def _use_indices(self) -> None:
        """Number every slot use of every channel in emission order: ``use_of[(id(xfer),
        block, piece)]`` and ``use_pos[(src, dst)][j]`` = its (round, step)."""
        self.use_of, self.use_pos = {}, {}
        for rnd, k, step, pieces in self._order():
            for k0, _ in pieces:
                for x in step:
                    if x.reduce:
                        for b in x.blocks:
                            pos = self.use_pos.setdefault((x.src, x.dst), [])
                            self.use_of[(id(x), b, k0)] = len(pos)
                            pos.append((rnd, k))
        self.chan_total = {c: len(v) for c, v in self.use_pos.items()}

    def _can_fuse(self, y, b: int, k0: int, at: tuple) -> bool:
        """Whether reduce send ``y`` may be fused into a composite at (round, step) ``at``."""
        j = self.use_of[(id(y), b, k0)]
        return j < self.slots or self.use_pos[(y.src, y.dst)][j - self.slots] < at

    def _credit_wait(self, x, b: int, k0: int):
        j = self.use_of[(id(x), b, k0)]
        return (Wait(f"c{x.dst}", j - self.slots + 1, 0),) if j >= self.slots else ()

    def _version_wait(self, r: int, b: int, k0: int):
        region, ver = self.where[(r, b, k0)]
        return (Wait(f"v{b}.{k0}", ver, 0),) if ver else ()

    def _target(self, x, b: int, k0: int):
        """(destination address, remote semaphore) of ``x``'s piece at ``k0`` of block ``b``."""
        dst_pe = self.grid.pes[x.dst]
        if x.reduce:
            loc, slot = self.slot(x.src, x.dst, self.use_of[(id(x), b, k0)])
            return loc, (dst_pe, f"x{x.src}.{slot}")
        return self.hbm(x.dst, "out", b, k0), (dst_pe, f"v{b}.{k0}")

    def _send(self, k: int, x, b: int, k0: int, ne: int) -> None:
        """The sender's DMA of one piece of block ``b`` (not fused into a composite)."""
        region, _ = self.where.get((x.src, b, k0), (None, 0))
        if region in (None, "gone"):
            raise AssertionError(f"{self.s.algo} step {k}: member {x.src} has no value of block {b} to send")
        loc, note = self._target(x, b, k0)
        waits = (self._credit_wait(x, b, k0) if x.reduce else ()) + self._version_wait(x.src, b, k0)
        self.ctx[x.src].dma_write(self.hbm(x.src, region, b, k0), loc, ne * self.eb, wait=waits, notify=(note,),
                                  label=f"s{k} {'red' if x.reduce else 'copy'} b{b}.{k0} to {x.dst}")

    def _receive(self, at: tuple, x, b: int, k0: int, ne: int) -> None:
        k = at[1]
        r = x.dst
        if not x.reduce:
            _, ver = self.where.get((r, b, k0), ("out", 0))
            self.where[(r, b, k0)] = ("out", ver + 1)
            return
        if self.where.get((r, b, k0), ("gone",))[0] == "gone":
            raise AssertionError(f"{self.s.algo} step {k}: member {r} reduces block {b} it does not hold")
        later = self.uses[(r, b)]
        later = later[later.index((k, 1, x)) + 1:]
        own_region, ver = self.where[(r, b, k0)]
        fused, reduce_fused, i = [], None, 0
        while i < len(later) and later[i][1] == 0 and len(fused) < MAX_WRITES - 1:
            y = later[i][2]
            needs_credit = y.reduce and self.use_of[(id(y), b, k0)] >= self.slots
            if y.reduce and (reduce_fused is not None or (needs_credit and ver) or not self._can_fuse(y, b, k0, at)):
                break
            reduce_fused = y if y.reduce else reduce_fused
            fused.append(y)
            i += 1
        rest = later[i:]
        final = not any(role == 1 for _, role, _ in later)
        spare = "tcm" if self.in_tcm else f"scr{(ver + 1) % 2}"
        store = "out" if final and b in self.s.keeps[r] else (spare if rest else None)
        self._composite(k, x, b, k0, ne, own_region, ver, fused, reduce_fused, store)
        for y in fused:
            self.fused.add((id(y), b, k0))
        self.where[(r, b, k0)] = (store, ver + 1) if store else ("gone", ver + 1)

    def _composite(self, k, x, b, k0, ne, own_region, ver, fused, reduce_fused, store) -> None:
        r, src = x.dst, x.src
        ctx = self.ctx[r]
        j = self.use_of[(id(x), b, k0)]
        _, slot = self.slot(src, r, j)
        waits = (Wait(f"x{src}.{slot}", j // self.slots + 1, 0),)
        waits += self._version_wait(r, b, k0) if ver else (self._credit_wait(reduce_fused, b, k0) if reduce_fused else ())
        te = ne * self.eb
        dests, notes = [], []
        for y in fused:
            loc, note = self._target(y, b, k0)
            dests.append(loc)
            notes.append(note)
        if store and store != "tcm":
            dests.append(self.hbm(r, store, b, k0))
        signals = []
        if j + self.slots < self.chan_total[(src, r)]:
            signals.append(Signal(f"k{src}"))
        if store:
            signals.append(Signal(f"v{b}.{k0}"))
        ctx.composite(tiles=1, staging=ctx.arena.buffers[0].at(), engine="math", dtype=self.dtype,
                      reads=() if own_region == "tcm" else (Move(self.hbm(r, own_region, b, k0), te, te),), fetch_bytes=2 * te,
                      flops=te // self.eb, store_bytes=te, writes=tuple(Move(d, te, te) for d in dests),
                      wait=waits, signal=tuple(signals), notify=tuple(notes),
                      label=f"s{k} {self.math_op} b{b}.{k0} from {src}")
        if signals and signals[0].sem == f"k{src}":
            ctx.send(self.grid.pes[src], f"c{r}", wait=f"k{src}", label=f"credit to {src}")
