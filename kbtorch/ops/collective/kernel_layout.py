"""Buffers, packets and addresses of the collective tile kernel (``kernel``), and the bytes
per member it moves (``padded_bytes``).

Buffers (per member, in its PE's HBM slice): ``IN`` (the input), ``OUT`` (the output; an
all-gather or broadcast works in place there) and, where a value must rest between steps,
two ``SCRATCH`` regions used alternately by version; up to ``TCM_VALUES`` bytes per member
the values between steps stay in a TCM buffer instead. In TCM also: a composite staging
area and ``slots`` receive slots per member that sends reduction data to this one.

Data moves in *packets* of at most ``packet_elems`` elements: a block larger than a packet
is cut into pieces, one packet each; blocks smaller than a packet that a transfer carries
side by side (consecutive block ids inside an aligned group) share one packet.
"""
from __future__ import annotations

from ...kernel import contexts
from ...runtime.allocator import AllocationError
from ...kernel.door import Loc
from ..layout import page_align, tcm_budget, tcm_granule
from .request import CollectiveError
from .steps import Schedule

# NOTE: buffering and packet choices of the kernel, not hardware (the TCM's size and granule
# and the page come from the machine, through ``layout``).
ROUND = 4
SLOTS = 2 * ROUND + 1
#: Receive slots per channel in HBM (``sprayed_reductions``): the rounds in flight of the
#: software-pipelined order (``CollectiveKernel._order``).
HBM_SLOTS = 4 * ROUND + 1
#: Pieces per round of the software-pipelined order (``sprayed_reductions``).
SPRAY_ROUND = 2
#: Sprayed: a block is cut into at least this many packets (``sprayed_packet``).
SPRAY_PIECES = 32
MAX_PACKET = 2**20
#: Up to this many bytes per member, values between steps stay in a TCM buffer instead of
#: HBM scratch (small collectives are latency-bound: no HBM round trip per step).
TCM_VALUES = 256 * 1024
#: Packets of the composite staging area in TCM.
STAGING_PACKETS = 4


def sprayed_reductions(machine, pes) -> bool:
    """Whether a kernel on ``pes`` runs as on a machine that sprays its packets (``[routing]``
    policy other than single; under ``port-spray``, members on more than one chip):
    reductions land in HBM, a step's partial sums stay in TCM, rounds are
    software-pipelined and reduction sends paced (``CollectiveKernel._order``, ``_pace``).

    NOTE: sprayed, a chip's ports take in its whole port bandwidth (Maia 200: 1400 GB/s of
    ANCs, against the 4 x 512 GB/s NoC links of the 4 tiles of ``across:chip:4``). A
    reduction crosses its receiving tile's link more than a copy does (the landed packet
    and the receiver's own value in, the sum out): written to HBM scratch and read back
    per sender, the partial sums of a step with several senders (hier's reduce-scatter: 3
    tray peers, then 4 chips) made the tiles' links carry 1.4 x the ANC link's share
    during the reduce-scatter. So a partial sum that the next composite of the same step
    adds to again stays in TCM (the staging area); a reduction's packet lands in the
    receiver's HBM as a copy does (receive slots there: ``HBM_SLOTS`` per channel, packets
    of ``sprayed_packet``, not limited to what the TCM's slots leave). Single-path machines
    keep TCM receive slots, HBM partials and rounds one after the other (their figures as
    they were), and so do kernels without reductions (all-gather, broadcast, all-to-all:
    their copies already land in HBM, and larger packets serve them best).

    NOTE: under ``port-spray`` a group inside one chip sends nothing through the ports (the
    chip's NoC routes stay single-path), so it runs as on a single-path machine: landing
    its reductions in HBM would only load the chip's HBM, which its tiles share (a 32 MiB
    ring reduce-scatter over the 36 tiles of one of maia200_x8's chips took 514.8 us that
    way, against 182.3 us as on maia200). ``minimal-spray`` sprays inside a chip too."""
    if not machine.multipath:
        return False
    return machine.routing.policy != "port-spray" or len({machine.chip_of(pe) for pe in pes}) > 1


def sprayed_packet(block_bytes: int) -> int:
    """Default packet of a sprayed kernel (one that reduces): ``1 / SPRAY_PIECES`` of a block, at
    least 64 KiB and at most 1 MiB (before the TCM limit). NOTE: enough packets per block
    for the rounds of the software-pipelined order to overlap (``CollectiveKernel._order``);
    copies alone keep ``packet_size`` (fewer, larger packets: no reductions to overlap)."""
    return max(64 * 1024, min(MAX_PACKET, block_bytes // SPRAY_PIECES))


def packet_size(xfer_bytes: int) -> int:
    """Default packet for transfers of up to ``xfer_bytes``: a quarter of that, at least 64
    KiB and at most 1 MiB (before the TCM limit). NOTE: each packet is one composite of one
    tile; consecutive composites stream through the MATH engine's stage units, so more
    packets pipeline as tiles would."""
    return min(xfer_bytes, max(64 * 1024, min(MAX_PACKET, xfer_bytes // 4)))


def padded_bytes(sched: Schedule, nbytes: int, eb: int) -> int | None:
    """Per-member bytes the kernel moves for ``nbytes``: whole blocks of ``sched``.

    NOTE: an all-reduce or a broadcast of any element count runs with its last block padded
    (at most ``blocks - 1`` elements more; NCCL cuts the last chunk short instead: less than
    one element per block apart). A reduce-scatter or all-gather needs equal member shares
    (as torch's tensor collectives do), each a whole number of blocks: else None, the
    algorithm does not apply."""
    elems = nbytes // eb
    if sched.kind == "all_to_all":
        # NOTE: the kernel addresses an all-to-all's n x n blocks in one region per member
        # (block s * n + d at its id), so it is given n x the member's buffer.
        return nbytes * sched.n if elems % sched.n == 0 else None
    if sched.kind in ("all_reduce", "broadcast"):
        return -(-elems // sched.blocks) * sched.blocks * eb
    return nbytes if elems % sched.blocks == 0 else None


def largest_xfer_blocks(sched: Schedule) -> int:
    """The most blocks one transfer of ``sched`` carries."""
    return max((len(x.blocks) for step in sched.steps for x in step), default=1)


class KernelLayout:
    """The schedule analysis, buffers and addresses of a collective kernel: ``sched`` on
    ``grid`` with ``nbytes`` per member."""

    def __init__(self, machine, sched: Schedule, grid, nbytes: int, elem_bytes: int, dtype: str, op: str,
                 packet_bytes: int | None = None, slots: int = SLOTS, sprayed: bool | None = None):
        self.m, self.s, self.grid, self.eb, self.dtype = machine, sched, grid, elem_bytes, dtype
        self.math_op = {"sum": "add", "max": "max"}[op]
        reduces = any(x.reduce for step in sched.steps for x in step)
        self.sprayed = reduces and (sprayed_reductions(machine, grid.pes) if sprayed is None else sprayed)
        self.round = SPRAY_ROUND if self.sprayed else ROUND
        self.slots = HBM_SLOTS if self.sprayed and slots == SLOTS else slots
        elems = nbytes // elem_bytes
        if nbytes % elem_bytes or elems % sched.blocks:
            raise CollectiveError(f"{sched.algo} {sched.kind}: {nbytes} bytes per member ({elems} elements of "
                                  f"{elem_bytes} bytes) do not split into {sched.blocks} equal blocks")
        self.nbytes, self.block_elems = nbytes, elems // sched.blocks
        self.ctx = contexts(machine, grid.pes, f"{sched.kind} {sched.algo}")
        self.tcm_of = [machine.pes[pe].node("tcm") for pe in grid.pes]
        self.uses = self._uses()
        self.chan_in = self._channels()
        self.packet_elems = self._packet_elems(packet_bytes)
        piece = min(self.packet_elems, self.block_elems)
        self.pieces = [(k, min(piece, self.block_elems - k)) for k in range(0, self.block_elems, piece)]
        self.per_packet = self.packet_elems // self.block_elems if len(self.pieces) == 1 else 1
        self._packets: dict = {}
        self.marked = False
        self._layout()

    @property
    def rounds(self) -> int:
        """Rounds of pieces (``round`` pieces each, the last may have fewer)."""
        return -(-len(self.pieces) // self.round)

    def truncate(self, rounds: int) -> None:
        """Keep the first ``rounds`` rounds of pieces and the last round: a truncated run of
        the fast-forward (``kernel.steady``). The pieces kept keep their addresses, so the
        kept rounds move exactly what they move in the whole kernel. Every command then
        carries its round as its ``mark`` (the run keeps each round's last completion)."""
        self.marked = True
        if 0 <= rounds < self.rounds - 1:
            self.pieces = self.pieces[:rounds * self.round] + self.pieces[(self.rounds - 1) * self.round:]

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
        cap = self.m.capacity("tcm", self.grid.pes[0])
        chans = max(len(c) for c in self.chan_in) or 1
        granule = tcm_granule(self.m, self.grid.pes[0])
        in_tcm = 0 if self.sprayed else chans * self.slots
        fit = tcm_budget(self.m, self.grid.pes[0]) // (in_tcm + STAGING_PACKETS) // granule * granule
        most = largest_xfer_blocks(self.s) * self.block_elems
        want = packet_bytes or (sprayed_packet(self.block_elems * self.eb) if self.sprayed else packet_size(most * self.eb))
        if packet_bytes and packet_bytes > fit:
            what = f"{chans} receive channels x {self.slots} slots" if in_tcm else f"{STAGING_PACKETS} staging packets"
            raise CollectiveError(f"packet_bytes={packet_bytes}: {what} do not fit the TCM ({cap} bytes); at most {fit}")
        elems = max(1, min(want, fit) // self.eb)
        if elems >= self.block_elems:
            return min(elems // self.block_elems * self.block_elems, most)
        return elems

    def _layout(self) -> None:
        s, eb = self.s, self.eb
        out_bytes = self.nbytes // s.n if s.kind == "reduce_scatter" else self.nbytes
        # NOTE: an all-gather's input is its own block of the output (in place), a broadcast's
        # buffer is its output; regions start on page boundaries (``layout.page_align``).
        sizes = {"in": self.nbytes}
        if s.kind in ("all_reduce", "reduce_scatter"):
            sizes["out"] = out_bytes
        sizes.update(scr0=self.nbytes, scr1=self.nbytes)
        slot_bytes = [len(c) * self.slots * self.packet_elems * eb for c in self.chan_in]
        # NOTE: a sprayed machine's reductions land in HBM receive slots (``sprayed_reductions``).
        self.regions = [self._regions(ctx, dict(sizes, **({"slots": n} if n and self.sprayed else {})))
                        for ctx, n in zip(self.ctx, slot_bytes)]
        self.slot0 = []
        for r, ctx in enumerate(self.ctx):
            ctx.tcm("staging", STAGING_PACKETS * self.packet_elems * eb)
            if self.chan_in[r] and self.sprayed:
                self.slot0.append(self.regions[r]["slots"].addr)
            elif self.chan_in[r]:
                self.slot0.append(ctx.tcm("receive slots", slot_bytes[r]).addr)
            else:
                self.slot0.append(0)
        # NOTE: the receive slots take the TCM the packet size leaves (``_packet_elems``): with
        # many reduction senders the values do not fit beside them and stay in HBM scratch.
        self.in_tcm = self.nbytes <= TCM_VALUES and all(ctx.largest_free("tcm") >= self.nbytes for ctx in self.ctx)
        self.val0 = [ctx.tcm("values", self.nbytes).addr if self.in_tcm else 0 for ctx in self.ctx]

    # ---- addresses ----------------------------------------------------------------------
    def _regions(self, ctx, sizes: dict) -> dict:
        """Member ``ctx``'s HBM regions (input, output, two scratch), or a CollectiveError."""
        try:
            out = {name: ctx.hbm(name, page_align(self.m, n)) for name, n in sizes.items()}
        except AllocationError as exc:
            need = sum(page_align(self.m, n) for n in sizes.values())
            raise CollectiveError(f"{self.s.kind}: {self.nbytes} bytes per member need {need} bytes of HBM "
                                  f"(input, output, 2 scratch) on PE {ctx.pe}: {exc}") from None
        out.setdefault("out", out["in"])
        return out

    def hbm(self, r: int, region: str, b: int, k: int) -> Loc:
        if region == "tcm":
            return Loc(self.tcm_of[r], self.val0[r] + (b * self.block_elems + k) * self.eb)
        if region == "acc":
            return self.ctx[r].buffer("staging").loc()
        if region == "out" and self.s.kind == "reduce_scatter":
            b = self.s.keeps[r].index(b)
        return self.regions[r][region].loc((b * self.block_elems + k) * self.eb)

    def span(self, r: int, region: str, bs: tuple, k: int) -> Loc:
        """Start of blocks ``bs`` (consecutive ids) of member ``r``'s ``region``: they lie
        side by side there (checked)."""
        if len(bs) == 1:
            return self.hbm(r, region, bs[0], k)
        first, last = self.hbm(r, region, bs[0], k), self.hbm(r, region, bs[-1], k)
        if last.addr - first.addr != (len(bs) - 1) * self.block_elems * self.eb:
            raise AssertionError(f"{self.s.algo}: blocks {bs} are not contiguous in {region} of member {r}")
        return first

    def slot(self, src: int, dst: int, use: int) -> tuple[Loc, int]:
        """(address, slot number) of use ``use`` of channel src -> dst: in the receiver's TCM,
        or its HBM (``sprayed``)."""
        i = self.chan_in[dst][src] * self.slots + use % self.slots
        where = self.ctx[dst].hbm_node if self.sprayed else self.tcm_of[dst]
        return Loc(where, self.slot0[dst] + i * self.packet_elems * self.eb), i

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
