"""The attention tile kernel: one PE's program for its items (see ``attention_plan``).

Every chunk ``x`` of the PE's items (in order, across item boundaries) is one online-softmax
step over four engines (sizes in bytes and flops, composite fields per tile):

- DMA read: an item's first chunk comes with its Q rows in one read into one of two head
  slots; every other chunk is one contiguous read into a ring of chunk buffers (one slot
  per chunk when they fit in ``RING_BYTES`` and, beside the other buffers, the TCM; else
  ``KV_SLOTS``);
- GEMM: ``QK(x)``, a composite per run of equal tiles (FETCH Q and a K tile -> S = Q K^T ->
  STORE S, fp32), and ``PV(x)`` (FETCH P and a V tile -> accumulate over the chunk -> STORE
  the chunk's output, fp32) into one of ``OPARTS`` slots;
- MATH (fp32): ``SM(x)`` (row max, exp, row sum; P stored in the input dtype) and ``MG(x)``,
  which rescales the running output by exp(m_old - m_new) and adds the chunk's (the first
  chunk of an item needs none: its output is the running one); an item's last ``MG``
  normalises, casts and DMA_WRITEs the output rows to HBM.

Order: a prefill PE is software-pipelined, ``QK(x+1)`` before ``PV(x)`` on the GEMM engine
and ``SM(x+1)`` before ``MG(x)`` on MATH, so the softmax of one chunk overlaps the Q K^T of
the next, across items too. A decode split PE waits on HBM and its merge follows its last
chunk, so it runs ``QK(x)``, ``SM(x)``, ``PV(x)``, ``MG(x)`` in turn: once its last read has
landed only that (short) chunk's work is left (a PE that ``follows`` its controller mate,
reading at the controller's full bandwidth, is pipelined again). Reads are issued
``LOOKAHEAD`` chunks ahead in program order (the command processor issues one command at a
time).

Semaphores (absolute thresholds, no decrement): ``h0/h1`` head slots filled, ``kv0..``
ring slots filled, ``qk``/``sm``/``pv`` chunks done, ``mg`` output slots freed; a buffer is
refilled only once its reader is done (by a wait, or by queue order where noted).

Decode split (``Work.tree``): the last ``MG`` also scatters the column slices of the PE's
partial (o, m, l; fp32) into its team members' TCM slots with remote semaphore increments
(``notify``, ``ra``); each member merges its slice over the team in one MATH composite,
members of other teams send the result to the same member of team 0 (``rb``), which merges
over the teams, normalises and writes its output columns.

NOTE: the softmax of a chunk needs its row max before any exponential, so ``SM`` fetches
each S tile twice (max pass, exp pass); its MATH work per score is the machine's
``attn_softmax`` (``flops_per_element``: max, scale-and-subtract, exp, sum) plus
``attn_mask`` on chunks that hold the diagonal; a merge costs ``attn_merge`` per output
element and ``attn_merge_row`` per row (max, exp of the difference, sum update) and merged
partial. TCM buffers are whole granules of the TCM, HBM regions whole pages (``layout``).
"""
from __future__ import annotations

from ..kernel.door import Loc, Move, Signal, Wait
from .attention_plan import AttentionShape, Work
from .layout import ACC_BYTES, page_align, tcm_align

# NOTE: buffering choices of the kernel (slots, lookahead, merge tiles), not hardware.
KV_SLOTS = 3
RING_BYTES = 4 * 2**20
LOOKAHEAD = 3
OPARTS = 3
MERGE_TILES = 4


def math_costs(machine, pe: int) -> dict:
    """The MATH flops of the kernel's softmax, mask and merges on PE ``pe`` (the machine's
    ``flops_per_element``: ``attn_softmax``, ``attn_mask``, ``attn_merge``, ``attn_merge_row``)."""
    return {op: machine.math_flops(f"attn_{op}", pe) for op in ("softmax", "mask", "merge", "merge_row")}


def merge_tiles(rows: int, d: int) -> int:
    """Tiles of a merge composite (equal slices of the rows x D output), so that its fetch,
    compute, store and write overlap."""
    return next(t for t in (MERGE_TILES, 2, 1) if rows * d % t == 0)


class AttentionLayout:
    """Byte offsets of a PE's item regions (Q rows then K/V rows) and outputs in its HBM
    buffer ``items``, and sizes of its TCM buffers (allocated in ``TCM_ORDER``: the tree slots first,
    so that every PE's are at address 0)."""

    TCM_ORDER = ("slots", "head", "kv", "s", "p", "opart", "oacc", "out")

    def __init__(self, machine, work: Work, shape: AttentionShape):
        d, eb = shape.d, shape.eb
        self.machine, self.pe = machine, work.pe
        self.rows = shape.group * max(it.positions for it in work.items)
        self.partial = tcm_align(machine, work.pe, self.rows * (d + 2) * ACC_BYTES)
        t = work.tree
        self.slot = tcm_align(machine, work.pe, self.rows * (t.columns(d, 0)[1] + 2) * ACC_BYTES) if t else 0
        tree_slots = (t.size - 1 + (t.teams - 1 if t.team == 0 else 0)) if t else 0
        self.key_bytes = 2 * d * eb
        self.q_bytes = [shape.group * it.positions * d * eb for it in work.items]
        self.base, off = [], 0
        for it, q in zip(work.items, self.q_bytes):
            self.base.append(off)
            off += page_align(machine, q + (it.k1 - it.k0) * self.key_bytes)
        self.o0, self.o_stride = off, page_align(machine, self.rows * d * eb)
        keys = max(c.keys for c in work.chunks)
        ring = sum(1 for c in work.chunks if not c.first)
        self.slots = ring if ring * keys * self.key_bytes <= RING_BYTES else KV_SLOTS
        self.sizes = {"slots": tree_slots * self.slot,
                      "head": 2 * (self.rows * d * eb + keys * self.key_bytes),
                      "kv": self.slots * keys * self.key_bytes, "s": 2 * self.rows * keys * ACC_BYTES,
                      "p": 2 * self.rows * keys * eb, "opart": OPARTS * self.partial, "oacc": self.partial,
                      "out": 2 * self.rows * d * eb}
        if self.slots != KV_SLOTS and self.tcm_bytes() > machine.capacity("tcm", work.pe):
            # NOTE: a ring within RING_BYTES may still not fit beside the other buffers: then the slots.
            self.slots = KV_SLOTS
            self.sizes["kv"] = KV_SLOTS * keys * self.key_bytes

    def tcm_bytes(self) -> int:
        return sum(tcm_align(self.machine, self.pe, n) for n in self.sizes.values() if n)

    def allocate(self, ctx) -> dict:
        """The HBM region of the items and outputs (``hbm``), then the TCM buffers."""
        bufs = {"hbm": ctx.hbm("items", self.o0 + len(self.q_bytes) * self.o_stride)}
        bufs.update((name, ctx.tcm(name, self.sizes[name])) for name in self.TCM_ORDER if self.sizes[name])
        if "slots" in bufs and bufs["slots"].addr != 0:
            raise AssertionError(f"PE {ctx.pe}: tree slots must start the TCM")
        return bufs

    def kv_addr(self, work: Work, i: int, key: int) -> int:
        return self.base[i] + self.q_bytes[i] + (key - work.items[i].k0) * self.key_bytes

    def o_addr(self, i: int) -> int:
        return self.o0 + i * self.o_stride


def attention_kernel(ctx, works: dict, shape: AttentionShape) -> None:
    """Queue PE ``ctx.pe``'s commands for its share of the attention (``works``: PE ->
    ``attention_plan.Work``)."""
    work = works.get(ctx.pe)
    if work is None:
        return
    _Program(ctx, work, shape).emit()


class _Program:
    def __init__(self, ctx, work: Work, shape: AttentionShape):
        self.ctx, self.work, self.shape = ctx, work, shape
        self.lay = AttentionLayout(ctx.machine, work, shape)
        self.flops = math_costs(ctx.machine, ctx.pe)
        self.buf = self.lay.allocate(ctx)
        self.last_chunk = {c.item: x for x, c in enumerate(work.chunks)}
        self.ring: dict = {}
        for x, c in enumerate(work.chunks):
            if not c.first:
                self.ring[x] = len(self.ring)
        self.ring_chunk = {r: x for x, r in self.ring.items()}
        self.pipelined = work.tree is None or work.follows

    def rows(self, x: int) -> int:
        return self.shape.group * self.work.items[self.work.chunks[x].item].positions

    def emit(self) -> None:
        """Reads run ``LOOKAHEAD`` chunks ahead in program order (the command processor
        issues one command at a time), then the software pipeline (module doc). A decode
        split PE waits on HBM, not on its engines, and its merge follows its last chunk:
        there P V(x) follows Q K^T(x) directly (no lag), so that only the last chunk's drain
        is left once its read has landed."""
        n = len(self.work.chunks)
        lag = 1 if self.pipelined else 0
        for x in range(min(LOOKAHEAD, n)):
            self.read(x)
        for x in range(n):
            self.qk(x)
            self.sm(x)
            if x >= lag:
                self.pv(x - lag)
                self.mg(x - lag)
            if x + LOOKAHEAD < n:
                self.read(x + LOOKAHEAD)
        for y in range(n - lag, n):
            self.pv(y)
            self.mg(y)
        self.team_merges()

    def read(self, x: int) -> None:
        """Chunk ``x``'s K/V rows; an item's first chunk comes with its Q rows into one of two
        head slots (free once item i - 2's last P V is done), the others into the ring."""
        ch = self.work.chunks[x]
        i, lay = ch.item, self.lay
        nbytes = ch.keys * lay.key_bytes
        if ch.first:
            wait = (Wait("pv", self.last_chunk[i - 2] + 1, 0),) if i >= 2 else ()
            wait += (Wait("go", 1, 0),) if self.work.follows and x == 0 else ()
            note = ((self.work.lead, "go"),) if self.work.lead is not None else ()
            self.ctx.dma_read(self.buf["hbm"].loc(lay.base[i]), self.buf["head"].loc((i % 2) * self.buf["head"].nbytes // 2),
                              lay.q_bytes[i] + nbytes, wait=wait, signal=f"h{i % 2}", notify=note,
                              label=f"read Q+KV {x}")
            return
        r, slots = self.ring[x], lay.slots
        # NOTE: ring slot r % slots held ring chunk r - slots, whose V rows its P V reads.
        wait = (Wait("pv", self.ring_chunk[r - slots] + 1, 0),) if r >= slots else ()
        self.ctx.dma_read(self.buf["hbm"].loc(lay.kv_addr(self.work, i, ch.k0)), self.buf["kv"].loc(), nbytes,
                          wait=wait, signal=f"kv{r % slots}", label=f"read KV {x}")

    def _runs(self, x: int, engine: str, label: str, waits: tuple, signals: tuple, make) -> None:
        """One composite per run of chunk ``x``: waits on the first, signals on the last;
        ``make(tiles, keys, run index)`` -> the composite's per-tile fields."""
        runs = self.work.chunks[x].runs
        for r, (n, keys) in enumerate(runs):
            last = r == len(runs) - 1
            self.ctx.composite(tiles=n, staging=self.buf["s"].loc(), engine=engine, wait=waits if r == 0 else (),
                               signal=signals if last else (), label=f"{label} {x}.{r} ({n}x{keys})",
                               **make(n, keys, r))

    def qk(self, x: int) -> None:
        i = self.work.chunks[x].item
        m, d, eb = self.rows(x), self.shape.d, self.shape.eb
        # NOTE: S slot x % 2 was read by SM(x - 2), which PV(x - 2), ahead in this queue, waited for.
        waits = (Wait(f"h{i % 2}", i // 2 + 1, 0),)
        if x in self.ring:
            r, slots = self.ring[x], self.lay.slots
            waits += (Wait(f"kv{r % slots}", r // slots + 1, 0),)
        self._runs(x, "gemm", "QK", waits, ("qk",), lambda n, keys, r: dict(
            dtype=self.shape.dtype, fetch_bytes=(m + keys) * d * eb, flops=2 * m * keys * d,
            store_bytes=m * keys * ACC_BYTES))

    def sm(self, x: int) -> None:
        m, eb = self.rows(x), self.shape.eb
        per = self.flops["softmax"] + (self.flops["mask"] if self.work.chunks[x].masked else 0)
        # NOTE: P slot x % 2 was read by PV(x - 2), which ran before QK(x) on the GEMM engine.
        self._runs(x, "math", "SM", (Wait("qk", x + 1, 0),), ("sm",), lambda n, keys, r: dict(
            dtype="fp32", fetch_bytes=2 * m * keys * ACC_BYTES, flops=per * m * keys, store_bytes=m * keys * eb))

    def pv(self, x: int) -> None:
        m, d, eb = self.rows(x), self.shape.d, self.shape.eb
        waits = (Wait("sm", x + 1, 0),) + ((Wait("mg", x - OPARTS + 1, 0),) if x >= OPARTS else ())
        last = len(self.work.chunks[x].runs) - 1
        self._runs(x, "gemm", "PV", waits, ("pv",), lambda n, keys, r: dict(
            dtype=self.shape.dtype, fetch_bytes=(m + d) * keys * eb, flops=2 * m * keys * d, accumulate=n,
            store_bytes=m * d * ACC_BYTES if r == last else 0))

    def _freed(self, x: int) -> Signal:
        """The output slots chunk ``x``'s merge frees: its own, and its predecessor's if that
        was its item's first chunk (whose output was the running one)."""
        return Signal("mg", 2 if not self.work.chunks[x].first and self.work.chunks[x - 1].first else 1)

    def mg(self, x: int) -> None:
        """Fold chunk ``x``'s output into the item's running output (see the module doc)."""
        ch = self.work.chunks[x]
        if ch.first and not ch.last:
            return                      # the chunk's output is the running output as it is
        merge = not ch.first
        if self.work.tree is not None and ch.last:
            self._scatter(x, merge)
            return
        m, d, eb = self.rows(x), self.shape.d, self.shape.eb
        t = merge_tiles(m, d)
        elems, stats = m * d // t, -(-2 * m // t)
        final = ch.last
        out = elems * eb if final else (elems + stats) * ACC_BYTES
        writes = (Move(self.buf["hbm"].loc(self.lay.o_addr(ch.item)), out, out),) if final else ()
        flops = (self.flops["merge"] * elems + self.flops["merge_row"] * stats // 2 if merge else 0) + \
            (elems if final else 0)
        self.ctx.composite(tiles=t, staging=self.buf["out"].loc(), engine="math", dtype="fp32",
                           fetch_bytes=(2 if merge else 1) * (elems + stats) * ACC_BYTES, flops=flops,
                           store_bytes=out, writes=writes, wait=Wait("pv", x + 1, 0), signal=self._freed(x),
                           label=f"MG {x}" + (" out" if final else ""))

    def _scatter(self, x: int, merge: bool) -> None:
        """A decode PE's partial (after merging its last chunk): slice i to team member i's
        slot, its own slice kept; a one-member team sends it whole to team 0."""
        t, m, d = self.work.tree, self.rows(x), self.shape.d
        writes, notify = [], []
        for i in range(t.size) if t.size > 1 else ():
            if i != t.member:
                pe = t.pes[t.team * t.size + i]
                writes.append(Move(self._slot(pe, t.member - (t.member > i)), self._slice(i)))
                notify.append((pe, "ra"))
        if t.size == 1 and t.team:
            writes.append(Move(self._slot(t.pes[0], t.team - 1), self._slice(0)))
            notify.append((t.pes[0], "rb"))
        part = m * (d + 2) * ACC_BYTES
        flops = m * (self.flops["merge"] * d + self.flops["merge_row"]) if merge else 0
        self.ctx.composite(tiles=1, staging=self.buf["out"].loc(), engine="math", dtype="fp32",
                           fetch_bytes=(2 if merge else 1) * part, flops=flops,
                           store_bytes=part, writes=tuple(writes), notify=tuple(notify), wait=Wait("pv", x + 1, 0),
                           signal=(self._freed(x), "own"), label=f"MG {x} scatter")

    def team_merges(self) -> None:
        """Merge this member's slice over its team, then (team 0) over the teams; the last
        merge normalises and writes the output columns (see ``attention_plan.Tree``)."""
        t = self.work.tree
        if t is None:
            return
        if t.size > 1:
            self._merge_slice(f"merge team {t.team}", t.size, (Wait("ra", t.size - 1, 0), Wait("own", 1, 0)),
                              final=t.team == 0 and t.teams == 1, send=t.team > 0)
        if t.team == 0 and t.teams > 1:
            waits = (Wait("rb", t.teams - 1, 0),) + ((Wait("own", 1, 0),) if t.size == 1 else ())
            self._merge_slice("merge teams", t.teams, waits, final=True, send=False)

    def _merge_slice(self, label: str, parts: int, waits: tuple, final: bool, send: bool) -> None:
        t, m, eb = self.work.tree, self.rows(0), self.shape.eb
        c0, c1 = t.columns(self.shape.d)
        cols = c1 - c0
        out = m * cols * eb if final else self._slice(t.member)
        writes, notify = (), ()
        if final:
            writes = (Move(self.buf["hbm"].loc(self.lay.o_addr(0)), out),)
        elif send:
            leader = t.pes[t.member]
            writes, notify = (Move(self._slot(leader, t.size - 1 + t.team - 1), out),), ((leader, "rb"),)
        flops = (parts - 1) * m * (self.flops["merge"] * cols + self.flops["merge_row"]) + (m * cols if final else 0)
        self.ctx.composite(tiles=1, staging=self.buf["out"].loc(), engine="math", dtype="fp32",
                           fetch_bytes=parts * self._slice(t.member), flops=flops, store_bytes=out, writes=writes,
                           notify=notify, wait=waits, label=label + (" out" if final else ""))

    def _slice(self, i: int) -> int:
        """Bytes of slice ``i`` of a partial: its columns of o and every row's m and l."""
        c0, c1 = self.work.tree.columns(self.shape.d, i)
        return self.rows(0) * (c1 - c0 + 2) * ACC_BYTES

    def _slot(self, pe: int, index: int) -> Loc:
        return Loc(self.ctx.machine.pes[pe].node("tcm"), index * self.lay.slot)
