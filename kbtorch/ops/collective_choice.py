"""The automatic algorithm choice of ``collective`` (``algo="auto"``): which algorithms
apply to a group and payload (``padded_bytes``: the per-member bytes the kernel moves, or
None) and the predicted time of each (``estimates``: the step-by-step alpha-beta estimate of
``collective_model``), from which ``collective`` takes the least, like NCCL's tuner."""
from __future__ import annotations

from . import collective_model as model
from .collective_layout import largest_xfer_blocks, packet_size
from .collective_plan import ALGOS, CollectiveError, schedule

DIRECT_MAX = 32



def padded_bytes(sched, nbytes: int, eb: int) -> int | None:
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


def estimates(kind: str, machine, grid, nbytes: int, eb: int, root: int = 0, packet_bytes: int | None = None,
              order: str = "rank") -> dict:
    """Predicted time (ps) of every algorithm that applies: ``{algo: ps}``.

    NOTE: ``direct`` is left out above ``DIRECT_MAX`` members: its n x n messages cost every
    member n - 1 command issues per phase, which no payload size makes up for there. Above
    that size, too, an algorithm whose command-issue floor (a lower bound of its estimate)
    already exceeds the best estimate so far is not estimated (fewest steps first)."""
    big = len(grid.pes) > DIRECT_MAX
    scheds = []
    for algo in ALGOS:
        if algo == "direct" and big:
            continue
        try:
            sched = schedule(kind, algo, grid, root, order)
        except CollectiveError:
            continue
        padded = padded_bytes(sched, nbytes, eb)
        if padded is None:
            continue
        scheds.append((len(sched.steps), ALGOS.index(algo), algo, sched, padded))
    out, best = {}, None
    for _, _, algo, sched, padded in sorted(scheds, key=lambda t: t[:2]):
        block = padded // sched.blocks
        packet = packet_bytes or packet_size(largest_xfer_blocks(sched) * block)
        if big and best is not None and model.issue_ps(machine, sched, block, packet) >= best:
            continue
        out[algo] = model.alpha_beta_ps(machine, sched, grid.pes, block, packet)
        best = out[algo] if best is None else min(best, out[algo])
    return {a: out[a] for a in ALGOS if a in out}
