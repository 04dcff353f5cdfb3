"""Tensors moving between chips: the pipeline stages' sends and a KV cache moving between
replicas (prefill/decode disaggregation), timed by the simulator.

A transfer goes chip to chip in pairs (chip ``i`` of the source to chip ``i`` of the
destination, every pair at once), each pair over ``LINES`` PE pairs: one broadcast of two
members per line, side by side, through the machine's own network (its links, switches and
routing).
"""
from __future__ import annotations


from ...kernel import by_fidelity
from ...ops.collective.side_by_side import on_groups_run
from ...topology import current_machine
from ..placement.mesh import chips_of
from ... import state

#: PE pairs per chip that carry a transfer.
# NOTE: as ``expert_parallel.LINES``: the engines that drive a chip's network, not hardware.
LINES = 4


@state.cache
@by_fidelity(1024)
def lines_ns(machine, lines: tuple, nbytes: int, dtype: str) -> tuple:
    """(latency ns, algorithm, how it was obtained) of ``nbytes`` from the first to the second
    PE of every line, at once."""
    latency, algo, result = on_groups_run("broadcast", [list(line) for line in lines], nbytes=nbytes, dtype=dtype,
                                          machine=machine)
    return latency, algo, result.obtained


def pair_lines(pairs: list) -> tuple:
    """(the PE lines, lines per pair) of chip pairs ``pairs`` ((source PEs, destination PEs)
    each): ``LINES`` per pair at most, spread evenly over each chip's PEs."""
    k = min(LINES, len(pairs[0][0]), len(pairs[0][1]))
    return tuple((a[t * len(a) // k], b[t * len(b) // k]) for a, b in pairs for t in range(k)), k


def line_bytes(share: int, k: int) -> int:
    """Bytes each of ``k`` lines carries of a pair's ``share`` (whole words, at least one)."""
    return max(4, -(-share // (4 * k)) * 4)


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
    lines, k = pair_lines([(chips[a], chips[b]) for a, b in zip(src, dst)])
    return float(lines_ns(machine, lines, line_bytes(-(-nbytes // len(src)), k), "bf16")[0])
