"""The collective tile kernel: a schedule (``collective_plan``) turned into PE commands.

Buffers (per member, in its PE's HBM slice): ``IN`` (the input), ``OUT`` (the output; an
all-gather or broadcast works in place there) and, where a value must rest between steps,
two ``SCRATCH`` regions used alternately by version. In TCM: a composite staging area and
``slots`` receive slots per member that sends reduction data to this one.

Data moves in *packets* of at most ``packet_bytes``: a block larger than a packet is cut
into pieces, one packet each; blocks smaller than a packet that a transfer carries side by
side (consecutive block ids) share one packet, so a step costs one command per packet, not
per block. Each packet moves on its own, so steps pipeline packet by packet. Per packet of
a transfer:

- reduce: the sender DMAs its value into a free receive slot of the receiver, with a remote
  semaphore increment of that slot (Maia's send with remote increment). The receiver runs
  one MATH composite: DMA_READ its own value (HBM) -> FETCH own + received -> add/max ->
  STORE -> DMA_WRITE the result. Where the result goes next is decided by looking ahead:
  straight into the next receiver's slot (fused forward), into the next receivers' ``OUT``
  (fused copy), and into its own ``OUT``/``SCRATCH`` if it is kept or needed later. A fused
  write may carry part of the packet (the blocks that transfer sends on). After the
  composite the receiver returns a credit over IPCQ; a sender reuses a slot only after the
  credit for its previous use has arrived.
- copy: the value is written into the receiver's ``OUT`` (a DMA, or fused into the
  composite that produced it), with a remote increment of the receiver's version semaphore.

Semaphores: ``x{src}.{slot}`` (arrivals in a slot), ``c{dst}`` (credits from a receiver),
``k{src}`` (slot of that sender consumed), ``v{block}.{piece}`` or ``v{first}-{last}.{piece}``
(versions of the value of a packet's blocks, counted per name). Waits on arrivals, credits
and versions use absolute thresholds without decrement, so they hold whatever engine the
matching signal comes from.
"""
from __future__ import annotations

from collections import Counter

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


def packet_size(xfer_bytes: int) -> int:
    """Default packet for transfers of up to ``xfer_bytes``: a quarter of that, at least 64
    KiB and at most 1 MiB (before the TCM limit). NOTE: each packet is one composite of one
    tile; consecutive composites stream through the MATH engine's stage units, so more
    packets pipeline as tiles would."""
    return min(xfer_bytes, max(64 * 1024, min(MAX_PACKET, xfer_bytes // 4)))


def largest_xfer_blocks(sched: Schedule) -> int:
    """The most blocks one transfer of ``sched`` carries."""
    return max((len(x.blocks) for step in sched.steps for x in step), default=1)


class _TooManyWaits(Exception):
    """A command of the kernel being built would wait on more than two semaphores."""


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
        piece = min(self.packet_elems, self.block_elems)
        self.pieces = [(k, min(piece, self.block_elems - k)) for k in range(0, self.block_elems, piece)]
        self.per_packet = self.packet_elems // self.block_elems if len(self.pieces) == 1 else 1
        self._packets: dict = {}
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
        """Elements of the largest packet: whole blocks when a block fits (so small blocks
        side by side share a packet), else a piece of a block."""
        cap = self.ctx[0].arena.capacity
        chans = max(len(c) for c in self.chan_in) or 1
        fit = (cap - 4096) // (chans * self.slots + 4) // 256 * 256
        most = largest_xfer_blocks(self.s) * self.block_elems
        want = packet_bytes or packet_size(most * self.eb)
        if packet_bytes and packet_bytes > fit:
            raise CollectiveError(f"packet_bytes={packet_bytes}: {chans} receive channels x {self.slots} slots "
                                  f"do not fit the TCM ({cap} bytes); at most {fit}")
        elems = max(1, min(want, fit) // self.eb)
        if elems >= self.block_elems:
            return min(elems // self.block_elems * self.block_elems, most)
        return elems

    def _layout(self) -> None:
        s, eb = self.s, self.eb
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

    def span(self, r: int, region: str, bs: tuple, k: int) -> Loc:
        """Start of blocks ``bs`` (consecutive ids) of member ``r``'s ``region``: they lie
        side by side there (checked)."""
        first, last = self.hbm(r, region, bs[0], k), self.hbm(r, region, bs[-1], k)
        if last.addr - first.addr != (len(bs) - 1) * self.block_elems * self.eb:
            raise AssertionError(f"{self.s.algo}: blocks {bs} are not contiguous in {region} of member {r}")
        return first

    def slot(self, src: int, dst: int, use: int) -> tuple[Loc, int]:
        """(TCM address, slot number) of use ``use`` of channel src -> dst."""
        i = self.chan_in[dst][src] * self.slots + use % self.slots
        return Loc(self.m.pes[self.grid.pes[dst]].node("tcm"), self.slot0[dst] + i * self.packet_elems * self.eb), i

    def packets(self, x) -> list:
        """The block tuples of ``x``'s packets: runs of consecutive block ids inside one
        aligned group of ``per_packet`` ids (so that a later transfer of part of a packet's
        blocks finds them made by one command)."""
        got = self._packets.get(x.blocks)
        if got is not None:
            return got
        out, run = [], [x.blocks[0]]
        for b in x.blocks[1:]:
            if b == run[-1] + 1 and b // self.per_packet == run[0] // self.per_packet:
                run.append(b)
            else:
                out.append(tuple(run))
                run = [b]
        out.append(tuple(run))
        self._packets[x.blocks] = out
        return out

    def packet_of(self, y, b: int) -> tuple:
        return next(bs for bs in self.packets(y) if b in bs)

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

    def _each(self, step, pieces):
        """(xfer, blocks of a packet, piece start, piece elements) of a step, in order."""
        for k0, ne in pieces:
            for x in step:
                for bs in self.packets(x):
                    yield x, bs, k0, ne

    def programs(self) -> dict:
        """``{pe: [commands]}`` of the whole collective. NOTE: a command waits on at most two
        semaphores; if packets of several blocks would make a composite wait on more (its
        blocks' values come from different commands), the kernel is built block by block."""
        try:
            return self._emit()
        except _TooManyWaits:
            if self.per_packet == 1:
                raise AssertionError(f"{self.s.algo}: a command would wait on more than two semaphores") from None
            self.per_packet, self._packets = 1, {}
            for ctx in self.ctx:
                ctx.commands.clear()
            return self._emit()

    def _emit(self) -> dict:
        s = self.s
        home = "in" if s.kind in ("all_reduce", "reduce_scatter") else "out"
        self.where = {(r, b, k0): home for r in range(s.n) for b in s.holds[r] for k0, _ in self.pieces}
        self.ready: dict = {}
        self.count: Counter = Counter()
        self.fused: set = set()
        self.split: dict = {}
        self._use_indices()
        for rnd, k, step, pieces in self._order():
            for x, bs, k0, ne in self._each(step, pieces):
                if (id(x), bs[0], k0) not in self.fused:
                    self._send(k, x, bs, k0, ne)
            for x, bs, k0, ne in self._each(step, pieces):
                self._receive((rnd, k), x, bs, k0, ne)
        for r in range(s.n):
            for b in s.keeps[r]:
                if self.where.get((r, b, 0)) != "out":
                    raise AssertionError(f"{s.algo}: member {r} block {b} did not reach OUT")
        return {ctx.pe: ctx.commands for ctx in self.ctx}

    def _use_indices(self) -> None:
        """Number every slot use of every channel in emission order: ``use_of[(id(xfer),
        first block, piece)]`` and ``use_pos[(src, dst)][j]`` = its (round, step)."""
        self.use_of, self.use_pos = {}, {}
        for rnd, k, step, pieces in self._order():
            for x, bs, k0, _ in self._each(step, pieces):
                if x.reduce:
                    pos = self.use_pos.setdefault((x.src, x.dst), [])
                    self.use_of[(id(x), bs[0], k0)] = len(pos)
                    pos.append((rnd, k))
        self.chan_total = {c: len(v) for c, v in self.use_pos.items()}

    # ---- value versions -----------------------------------------------------------------
    @staticmethod
    def _name(bs: tuple, k0: int) -> str:
        return f"v{bs[0]}.{k0}" if len(bs) == 1 else f"v{bs[0]}-{bs[-1]}.{k0}"

    def _produce(self, r: int, bs: tuple, k0: int, region, name: str | None = None) -> None:
        """A new value of ``bs`` at member ``r`` (in ``region``; None: not kept), announced by
        one signal of semaphore ``name`` (default: the packet's version semaphore)."""
        name = name or self._name(bs, k0)
        if region is not None:
            self.count[(r, name)] += 1
        for b in bs:
            self.where[(r, b, k0)] = region or "gone"
            self.ready[(r, b, k0)] = (name, self.count[(r, name)]) if region else None

    def _arrival(self, x, bs: tuple, k0: int) -> str:
        """The semaphore copy ``x`` of ``bs`` increments at its receiver. NOTE: when every block
        is next sent on by one packet of the receiver, the copy counts on that packet's own
        semaphore, which only the copies feeding it increment, so the packet waits once for
        all of them (an all-gather step forwards what several steps brought) instead of once
        per producer; otherwise the packet's version semaphore."""
        names = set()
        for b in bs:
            later = self.uses[(x.dst, b)]
            i = next(i for i, (_, role, y) in enumerate(later) if role == 1 and y is x)
            if i + 1 == len(later) or later[i + 1][1] != 0:
                return self._name(bs, k0)
            k, _, y = later[i + 1]
            names.add(f"n{k}.{y.dst}.{self.packet_of(y, b)[0]}.{k0}")
        return names.pop() if len(names) == 1 else self._name(bs, k0)

    def _version_wait(self, r: int, bs: tuple, k0: int) -> tuple:
        """Waits for the current value of ``bs`` at ``r`` (none for an input): per semaphore,
        the highest count any of the blocks needs."""
        need: dict = {}
        for b in bs:
            v = self.ready.get((r, b, k0))
            if v is not None:
                need[v[0]] = max(need.get(v[0], 0), v[1])
        return tuple(Wait(name, n, 0) for name, n in need.items())

    def _region(self, r: int, bs: tuple, k0: int, what: str) -> str:
        regions = {self.where.get((r, b, k0), "gone") for b in bs}
        if len(regions) != 1 or "gone" in regions:
            raise AssertionError(f"{self.s.algo}: member {r} {what} blocks {bs}, held in {sorted(regions)}")
        return regions.pop()

    # ---- transfers ----------------------------------------------------------------------
    def _can_fuse(self, y, b: int, k0: int, at: tuple) -> bool:
        """Whether reduce send ``y`` may be fused into a composite at (round, step) ``at``."""
        j = self.use_of[(id(y), b, k0)]
        return j < self.slots or self.use_pos[(y.src, y.dst)][j - self.slots] < at

    def _credit_wait(self, x, b: int, k0: int):
        j = self.use_of[(id(x), b, k0)]
        return (Wait(f"c{x.dst}", j - self.slots + 1, 0),) if j >= self.slots else ()

    def _target(self, x, bs: tuple, k0: int):
        """(destination address, remote semaphore) of ``x``'s packet ``bs`` at piece ``k0``."""
        dst_pe = self.grid.pes[x.dst]
        if x.reduce:
            loc, slot = self.slot(x.src, x.dst, self.use_of[(id(x), bs[0], k0)])
            return loc, (dst_pe, f"x{x.src}.{slot}")
        return self.span(x.dst, "out", bs, k0), (dst_pe, self._arrival(x, bs, k0))

    def _send(self, k: int, x, bs: tuple, k0: int, ne: int) -> None:
        """The sender's DMA(s) of one packet (not fused into a composite). NOTE: a command
        waits on at most two semaphores; a copy whose blocks got their values from more
        producers goes as several DMAs (``split``; its receiver counts versions the same way)."""
        parts = [bs]
        if not x.reduce:
            parts = self._split(x.src, bs, k0)
            if len(parts) > 1:
                self.split[(id(x), bs[0], k0)] = parts
        for part in parts:
            region = self._region(x.src, part, k0, f"step {k} sends")
            loc, note = self._target(x, part, k0)
            waits = (self._credit_wait(x, part[0], k0) if x.reduce else ()) + self._version_wait(x.src, part, k0)
            if len(waits) > 2:
                raise _TooManyWaits
            self.ctx[x.src].dma_write(self.span(x.src, region, part, k0), loc, len(part) * ne * self.eb, wait=waits,
                                      notify=(note,), label=f"s{k} {'red' if x.reduce else 'copy'} b{part[0]}"
                                      f"{'' if len(part) == 1 else f'-{part[-1]}'}.{k0} to {x.dst}")

    def _split(self, r: int, bs: tuple, k0: int) -> list:
        """``bs`` cut into runs whose current values at ``r`` need at most two semaphores."""
        parts, seen = [[]], set()
        for b in bs:
            v = self.ready.get((r, b, k0))
            if v is not None and v[0] not in seen and len(seen) == 2:
                parts.append([])
                seen = set()
            if v is not None:
                seen.add(v[0])
            parts[-1].append(b)
        return [tuple(p) for p in parts]

    def _after(self, r: int, b: int, k: int, x) -> list:
        later = self.uses[(r, b)]
        return later[later.index((k, 1, x)) + 1:]

    def _fusable(self, at: tuple, x, bs: tuple, k0: int, versioned: bool):
        """The sends right after this reduce that its composite writes directly: each is one
        packet of the sends that immediately follow it for all the packet's blocks (a part of
        ``bs`` or all of it), at most one of them a reduce. -> (fused [(xfer, blocks)], the
        fused reduce or None, per block its uses not fused)."""
        after = {b: self._after(x.dst, b, at[1], x) for b in bs}
        cands = []
        for b in bs:
            for _, role, y in after[b]:
                if role:
                    break
                if all(y is not c for c in cands):
                    cands.append(y)
        fused, reduce_fused, taken = [], None, Counter()
        for y in cands:
            mine = [p for p in self.packets(y) if set(p) & set(bs)]
            if len(fused) == MAX_WRITES - 1 or len(mine) != 1 or not set(mine[0]) <= set(bs):
                break
            pk = mine[0]
            if any(taken[b] >= len(after[b]) or after[b][taken[b]][2] is not y for b in pk):
                break
            if y.reduce:
                needs_credit = self.use_of[(id(y), pk[0], k0)] >= self.slots
                if reduce_fused is not None or (needs_credit and versioned) or not self._can_fuse(y, pk[0], k0, at):
                    break
                reduce_fused = (y, pk)
            fused.append((y, pk))
            for b in pk:
                taken[b] += 1
        return fused, reduce_fused, {b: after[b][taken[b]:] for b in bs}

    def _receive(self, at: tuple, x, bs: tuple, k0: int, ne: int) -> None:
        r = x.dst
        if not x.reduce:
            for part in self.split.get((id(x), bs[0], k0), [bs]):
                self._produce(r, part, k0, "out", self._arrival(x, part, k0))
            return
        own_region = self._region(r, bs, k0, f"step {at[1]} reduces")
        versioned = bool(self._version_wait(r, bs, k0))
        fused, reduce_fused, rest = self._fusable(at, x, bs, k0, versioned)
        spare = "tcm" if self.in_tcm else ("scr0" if own_region == "scr1" else "scr1")
        stores = set()
        for b in bs:
            final = not any(role == 1 for _, role, _ in self._after(r, b, at[1], x))
            stores.add("out" if final and b in self.s.keeps[r] else (spare if rest[b] else None))
        kept = stores - {None}
        if len(kept) > 1:
            raise AssertionError(f"{self.s.algo} step {at[1]}: member {r} must keep blocks {bs} in {sorted(kept)}")
        store = kept.pop() if kept else None
        self._composite(at[1], x, bs, k0, ne, own_region, fused, reduce_fused, store)
        for y, pk in fused:
            self.fused.add((id(y), pk[0], k0))
        self._produce(r, bs, k0, store)

    def _composite(self, k, x, bs, k0, ne, own_region, fused, reduce_fused, store) -> None:
        r, src = x.dst, x.src
        ctx = self.ctx[r]
        j = self.use_of[(id(x), bs[0], k0)]
        _, slot = self.slot(src, r, j)
        waits = (Wait(f"x{src}.{slot}", j // self.slots + 1, 0),) + self._version_wait(r, bs, k0)
        waits += self._credit_wait(reduce_fused[0], reduce_fused[1][0], k0) if reduce_fused else ()
        if len(waits) > 2:
            raise _TooManyWaits
        te = len(bs) * ne * self.eb
        writes, notes = [], []
        for y, pk in fused:
            loc, note = self._target(y, pk, k0)
            writes.append(Move(loc, len(pk) * ne * self.eb, len(pk) * ne * self.eb))
            notes.append(note)
        if store and store != "tcm":
            writes.append(Move(self.span(r, store, bs, k0), te, te))
        signals = []
        if j + self.slots < self.chan_total[(src, r)]:
            signals.append(Signal(f"k{src}"))
        if store:
            signals.append(Signal(self._name(bs, k0)))
        reads = () if own_region == "tcm" else (Move(self.span(r, own_region, bs, k0), te, te),)
        ctx.composite(tiles=1, staging=ctx.arena.buffers[0].at(), engine="math", dtype=self.dtype,
                      reads=reads, fetch_bytes=2 * te, flops=te // self.eb, store_bytes=te, writes=tuple(writes),
                      wait=waits, signal=tuple(signals), notify=tuple(notes),
                      label=f"s{k} {self.math_op} b{bs[0]}{'' if len(bs) == 1 else f'-{bs[-1]}'}.{k0} from {src}")
        if signals and signals[0].sem == f"k{src}":
            ctx.send(self.grid.pes[src], f"c{r}", wait=f"k{src}", label=f"credit to {src}")
