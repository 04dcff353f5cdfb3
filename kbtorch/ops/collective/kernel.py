"""The collective tile kernel: a schedule (``schedules``) turned into PE commands.

Buffers, packets and addresses are ``kernel_layout``'s. Each packet moves on its own, so
steps pipeline packet by packet; a step costs one command per packet, not per block. Per
packet of a transfer:

- reduce: the sender DMAs its value into a free receive slot of the receiver, with a remote
  semaphore increment of that slot (Maia's send with remote increment). The receiver runs
  one MATH composite: DMA_READ its own value (HBM) -> FETCH own + received -> add/max ->
  STORE -> DMA_WRITE the result. Where the result goes next is decided by looking ahead:
  straight into the next receiver's slot (fused forward), into the next receivers' ``OUT``
  (fused copy), and into its own ``OUT``/``SCRATCH`` if it is kept or needed later. A fused
  write may carry part of the packet (the blocks that transfer sends on). After the
  composite the receiver returns a credit over IPCQ; a sender reuses a slot only after the
  credit for its previous use has arrived. On a sprayed machine
  (``kernel_layout.sprayed_reductions``) the slots are in the receiver's HBM (the
  composite DMA_READs the landed packet too), a partial sum that the same step adds to again
  stays in TCM (``acc``: the staging area), rounds are software-pipelined (``_order``) and
  reduction sends paced (``_pace``).
- copy: the value is written into the receiver's ``OUT`` (a DMA, or fused into the
  composite that produced it), with a remote increment of the receiver's version semaphore.
  On a machine with multicast, the copies of one packet that a member sends to several
  receivers in one step (``direct`` all-gather and broadcast) are ONE multicast command
  when their tree splits only at multicast routers (``multicast``).

Semaphores: ``x{src}.{slot}`` (arrivals in a slot), ``c{dst}`` (credits from a receiver),
``k{src}`` (slot of that sender consumed), ``v{block}.{piece}`` or ``v{first}-{last}.{piece}``
(versions of the value of a packet's blocks, counted per name), ``n{step}.{dst}.{block}.{piece}``
(copies feeding the receiver's packet sent at that step; see ``_arrival``). Waits on arrivals, credits
and versions use absolute thresholds without decrement, so they hold whatever engine the
matching signal comes from.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ...kernel.door import Move, Signal, Wait
from .kernel_layout import KernelLayout
from .multicast import multicast_copies, tree_ok

MAX_WRITES = 3          # NOTE: a kernel choice (writes per composite), not hardware
PACE_ROUNDS = 2         # NOTE: a kernel choice: rounds of step 0 in flight when paced (``_pace``)


class _TooManyWaits(Exception):
    """A command of the kernel being built would wait on more than two semaphores."""


class CollectiveKernel(KernelLayout):
    """Builds ``{pe: [commands]}`` for ``sched`` on ``grid`` with ``nbytes`` per member."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._arrivals: dict = {}
        self.multicast = bool(self.m.multicast_nodes)
        self.tree_log: set = set()      # (src, dsts, one tree?) of every grouping asked (``multicasts_alike``)

    # ---- emission -----------------------------------------------------------------------
    def _order(self):
        """(round, step index, step, piece) in emission order.

        NOTE: pieces are taken in rounds of ``round`` (``ROUND``; sprayed ``SPRAY_ROUND``,
        ``kernel_layout``); inside a round every step runs for all
        its pieces before the next step (so consecutive composites stream), rounds follow
        each other (NCCL's chunk loop). On a sprayed machine (``sprayed_reductions``) the
        rounds are software-pipelined instead: step ``k`` of round ``r`` comes with step 0 of
        round ``r + k`` (a wavefront, newest round first), so that a round's later steps,
        which wait for its earlier ones across the network, do not hold the next rounds'
        sends back in the engines' in-order queues. Every wait points to an earlier
        (round, step) of this order or to an earlier command of the same engine queue, so no
        schedule can deadlock: a fused forward that needs a credit is only fused if that
        credit is for a slot use of an earlier (round, step) (see ``_can_fuse``).
        """
        steps, size = self.s.steps, self.round
        rounds = -(-len(self.pieces) // size)
        if not self.sprayed:
            order = [(r, k) for r in range(rounds) for k in range(len(steps))]
        else:
            order = [(d - k, k) for d in range(rounds + len(steps) - 1) for k in range(len(steps)) if 0 <= d - k < rounds]
        for r, k in order:
            yield r, k, steps[k], self.pieces[r * size:(r + 1) * size]

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
        self.last_kept: dict = {}       # (member, step, round) -> (semaphore, count) of its last kept reduction
        self.acc: dict = {}             # member -> the packet whose partial sum its TCM holds (one at a time)
        self._use_indices()
        for rnd, k, step, pieces in self._order():
            self.at = (rnd, k)
            made = [len(ctx.commands) for ctx in self.ctx]
            sends = [(x, bs, k0, ne) for x, bs, k0, ne in self._each(step, pieces) if (id(x), bs[0], k0) not in self.fused]
            for group in (multicast_copies(self.m, self.grid.pes, sends, self.tree_log) if self.multicast
                          else ([s] for s in sends)):
                if len(group) == 1 or len(self._split(group[0][0].src, group[0][1], group[0][2])) > 1:
                    for x, bs, k0, ne in group:
                        self._send(k, x, bs, k0, ne)
                else:
                    self._multicast(k, group)
            for x, bs, k0, ne in self._each(step, pieces):
                self._receive((rnd, k), x, bs, k0, ne)
            if self.marked:
                for ctx, n in zip(self.ctx, made):
                    ctx.commands[n:] = [replace(c, mark=rnd) for c in ctx.commands[n:]]
        for r in range(s.n):
            for b in s.keeps[r]:
                if self.where.get((r, b, 0)) != "out":
                    raise AssertionError(f"{s.algo}: member {r} block {b} did not reach OUT")
        return {ctx.pe: ctx.commands for ctx in self.ctx}

    def multicasts_alike(self, pes: tuple) -> bool:
        """Whether members on PEs ``pes`` (another line of the same shape) would group this
        kernel's copies into multicasts as it did: the only choice of the kernel that depends
        on routes (``multicast_copies``)."""
        return all(tree_ok(self.m, pes[s], tuple(pes[d] for d in ds)) == ok for s, ds, ok in self.tree_log)

    def _use_indices(self) -> None:
        """Number every slot use of every channel in emission order: ``use_of[(id(xfer),
        first block, piece)]`` and ``use_pos[(src, dst)][j]`` = the place of its (round, step)
        in emission order (``place``)."""
        self.use_of, self.use_pos, self.place = {}, {}, {}
        for i, (rnd, k, step, pieces) in enumerate(self._order()):
            self.place[(rnd, k)] = i
            for x, bs, k0, _ in self._each(step, pieces):
                if x.reduce:
                    pos = self.use_pos.setdefault((x.src, x.dst), [])
                    self.use_of[(id(x), bs[0], k0)] = len(pos)
                    pos.append(i)
        self.chan_total = {c: len(v) for c, v in self.use_pos.items()}

    def _pace(self, m: int, at: tuple) -> tuple:
        """The wait that paces member ``m``'s reduction sends of (round, step) ``at`` on a
        sprayed machine: step ``k`` of round ``r`` starts once the member's reductions of
        step ``k - 1`` of that round are done (the last of them that keeps its result,
        ``last_kept``), step 0 once those of step 0 of round ``r - PACE_ROUNDS`` are (no
        wait if there are none).

        NOTE: a send whose value is already there (an input) would otherwise leave at once;
        sprayed, it takes a share of every port, the switch ports too, while the transfers
        that can only cross the switch (the partial sums a chip forwards to the other tray)
        come later, behind it in the port's queue. Paced, each round's step runs together
        with what it depends on, so the spray splits the step's own traffic: a self-clocked
        window, as NCCL's per-step FIFO of a channel."""
        r, k = at
        got = self.last_kept.get((m, k - 1, r) if k else (m, 0, r - PACE_ROUNDS))
        return (Wait(*got, 0),) if got else ()

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
        key = (id(x), bs, k0)
        if key not in self._arrivals:
            self._arrivals[key] = self._arrival_name(x, bs, k0)
        return self._arrivals[key]

    def _arrival_name(self, x, bs: tuple, k0: int) -> str:
        names = set()
        for b in bs:
            later = self._after(b, x)
            if not later or later[0][1] != 0:
                return self._name(bs, k0)
            k, _, y = later[0]
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
        return j < self.slots or self.use_pos[(y.src, y.dst)][j - self.slots] < self.place[at]

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
            if x.reduce and self.sprayed and len(waits) < 2:
                waits += self._pace(x.src, self.at)
            self.ctx[x.src].dma_write(self.span(x.src, region, part, k0), loc, len(part) * ne * self.eb, wait=waits,
                                      notify=(note,), label=f"s{k} {'red' if x.reduce else 'copy'} b{part[0]}"
                                      f"{'' if len(part) == 1 else f'-{part[-1]}'}.{k0} to {x.dst}")

    def _multicast(self, k: int, group: list) -> None:
        """One packet copied from one member to several receivers as one multicast."""
        x, bs, k0, ne = group[0]
        region = self._region(x.src, bs, k0, f"step {k} sends")
        targets = [self._target(y, bs, k0) for y, *_ in group]
        waits = self._version_wait(x.src, bs, k0)
        if len(waits) > 2:
            raise _TooManyWaits
        self.ctx[x.src].multicast(self.span(x.src, region, bs, k0), [loc for loc, _ in targets], len(bs) * ne * self.eb,
                                  wait=waits, notify=tuple(note for _, note in targets),
                                  label=f"s{k} multicast b{bs[0]}{'' if len(bs) == 1 else f'-{bs[-1]}'}.{k0} "
                                  f"to {', '.join(str(y.dst) for y, *_ in group)}")

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

    def _after(self, b: int, x) -> list:
        """The uses of block ``b`` at ``x``'s receiver after it receives ``x`` (each transfer
        of a schedule is its own object)."""
        later = self.uses[(x.dst, b)]
        i = next(i for i, (_, role, y) in enumerate(later) if role == 1 and y is x)
        return later[i + 1:]

    def _fusable(self, at: tuple, x, bs: tuple, k0: int, versioned: bool, after: dict):
        """The sends right after this reduce that its composite writes directly: each is one
        packet of the sends that immediately follow it for all the packet's blocks (a part of
        ``bs`` or all of it), at most one of them a reduce; ``after``: per block its uses after
        this receive. -> (fused [(xfer, blocks)], the fused reduce or None, per block its uses
        not fused)."""
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
        after = {b: self._after(b, x) for b in bs}
        fused, reduce_fused, rest = self._fusable(at, x, bs, k0, versioned, after)
        spare = "tcm" if self.in_tcm else ("scr0" if own_region == "scr1" else "scr1")
        stores = set()
        for b in bs:
            final = not any(role == 1 for _, role, _ in after[b])
            stores.add("out" if final and b in self.s.keeps[r] else (spare if rest[b] else None))
        kept = stores - {None}
        if len(kept) > 1:
            raise AssertionError(f"{self.s.algo} step {at[1]}: member {r} must keep blocks {bs} in {sorted(kept)}")
        store = kept.pop() if kept else None
        if own_region == "acc":
            del self.acc[r]
        if store == spare and self.sprayed and r not in self.acc and self._next_reduce_here(at, x, bs, rest):
            store, self.acc[r] = "acc", (bs, k0)
        self._composite(at[1], x, bs, k0, ne, own_region, fused, reduce_fused, store)
        for y, pk in fused:
            self.fused.add((id(y), pk[0], k0))
        self._produce(r, bs, k0, store)
        if store:
            self.last_kept[(r, at[1], at[0])] = self.ready[(r, bs[0], k0)]

    def _next_reduce_here(self, at: tuple, x, bs: tuple, rest: dict) -> bool:
        """Whether the next use of every block of ``bs`` at ``x``'s receiver is a reduction of
        the same packet in the same step (the partial sum is needed by that composite only)."""
        for b in bs:
            if not rest[b]:
                return False
            k, role, y = rest[b][0]
            if k != at[1] or role != 1 or not y.reduce or self.packet_of(y, b) != bs:
                return False
        return True

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
        if store and store not in ("tcm", "acc"):
            writes.append(Move(self.span(r, store, bs, k0), te, te))
        signals = []
        if j + self.slots < self.chan_total[(src, r)]:
            signals.append(Signal(f"k{src}"))
        if store:
            signals.append(Signal(self._name(bs, k0)))
        reads = () if own_region in ("tcm", "acc") else (Move(self.span(r, own_region, bs, k0), te, te),)
        if self.sprayed:
            reads += (Move(self.slot(src, r, j)[0], te, te),)
        ctx.composite(tiles=1, staging=ctx.buffer("staging").loc(), engine="math", dtype=self.dtype,
                      reads=reads, fetch_bytes=2 * te, flops=self.m.math_flops(self.math_op, ctx.pe) * (te // self.eb), store_bytes=te, writes=tuple(writes),
                      wait=waits, signal=tuple(signals), notify=tuple(notes),
                      label=f"s{k} {self.math_op} b{bs[0]}{'' if len(bs) == 1 else f'-{bs[-1]}'}.{k0} from {src}")
        if signals and signals[0].sem == f"k{src}":
            ctx.send(self.grid.pes[src], f"c{r}", wait=f"k{src}", label=f"credit to {src}")
