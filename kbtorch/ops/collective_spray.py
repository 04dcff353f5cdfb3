"""The sprayed-reduction helpers of the collective kernel (``collective_kernel``): on a
sprayed machine (``collective_layout.sprayed_reductions``) a member's reduction sends are
paced (``_pace``), and a partial sum that the same step adds to again stays in TCM
(``_next_reduce_here``: the kernel's ``acc``)."""
from __future__ import annotations

from ..sim.commands import Wait

PACE_ROUNDS = 2         # NOTE: a kernel choice: rounds of step 0 in flight when paced (``_pace``)


class SprayedReductions:
    """Mixin of ``CollectiveKernel``: reads its ``last_kept`` (per (member, step, round) the
    version of its last kept reduction) and ``packet_of`` (``collective_layout``)."""

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
