"""Tensors moving between chips: the pipeline stages' sends and a KV cache moving between
replicas (prefill/decode disaggregation), timed by the simulator.

A transfer goes chip to chip in pairs (chip ``i`` of the source to chip ``i`` of the
destination, every pair at once), each pair over ``LINES`` PE pairs: one broadcast of two
members per line, side by side, through the machine's own network (its links, switches and
routing).
"""
from __future__ import annotations

from functools import lru_cache

from ...ops.collective.side_by_side import on_groups_run
from ...topology import current_machine
from ..placement.mesh import chips_of
from ... import state

#: PE pairs per chip that carry a transfer.
# NOTE: as ``expert_parallel.LINES``: the engines that drive a chip's network, not hardware.
LINES = 4


@state.cache
@lru_cache(maxsize=1024)
def lines_ns(machine, lines: tuple, nbytes: int, dtype: str) -> tuple:
    """(latency ns, algorithm) of ``nbytes`` from the first to the second PE of every line, at once."""
    latency, algo, _ = on_groups_run("broadcast", [list(line) for line in lines], nbytes=nbytes, dtype=dtype,
                                     machine=machine)
    return latency, algo


def chip_transfer_ns(src_chips, dst_chips, nbytes: int, machine=None) -> float:
    """Simulated ns of ``nbytes`` moving from the chips ``src_chips`` to ``dst_chips`` (two
    disjoint lists of one length) of ``machine`` (default: the current one), each source chip
    sending its share (a tensor sharded over them: a tensor-parallel replica's KV cache)."""
    machine = machine or current_machine()
    chips = chips_of(machine)
    src, dst = tuple(src_chips), tuple(dst_chips)
    if len(src) != len(dst) or not src or set(src) & set(dst):
        raise ValueError(f"chip transfer: source chips {list(src)} and destination chips {list(dst)} "
                         f"must be two disjoint lists of one length")
    for c in (*src, *dst):
        if not 0 <= c < len(chips):
            raise ValueError(f"chip transfer: chip {c} is outside topology '{machine.name}' ({len(chips)} chips)")
    if nbytes < 1:
        raise ValueError(f"chip transfer: nbytes must be positive, got {nbytes}")
    k = min(LINES, len(chips[0]))
    lines = tuple((chips[a][t * len(chips[a]) // k], chips[b][t * len(chips[b]) // k])
                  for a, b in zip(src, dst) for t in range(k))
    per_line = max(4, -(-nbytes // (4 * len(lines))) * 4)
    return float(lines_ns(machine, lines, per_line, "bf16")[0])
