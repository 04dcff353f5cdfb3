"""Synthetic PE-to-PE traffic in the manner of BookSim's patterns, all injected at t=0.

Each message goes from a source PE's TCM (through its DMA write port) to a destination
PE's TCM (through its DMA read port): pure network traffic, no memory channels.

- ``uniform``: source and destination drawn uniformly (destination != source).
- ``transpose``: message i leaves PE ``i mod P``; the destination swaps the high and low
  halves of the PE index bits (P a power of four), or mirrors the index otherwise; a PE
  that maps to itself sends to the PE half the machine away.
- ``hotspot``: sources uniform; a quarter of the messages go to PE 0, the rest uniform.
"""
from __future__ import annotations

import random

PATTERNS = ("uniform", "transpose", "hotspot")


def _transpose(i: int, p: int) -> int:
    bits = p.bit_length() - 1
    if 1 << bits == p and bits % 2 == 0:
        half = bits // 2
        j = ((i & ((1 << half) - 1)) << half) | (i >> half)
    else:
        j = p - 1 - i
    return j if j != i else (i + p // 2) % p


def pattern_pairs(pattern: str, n_pes: int, messages: int, seed: int) -> list[tuple[int, int]]:
    """``messages`` (src PE, dst PE) pairs for ``pattern``; deterministic for a seed."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown traffic pattern '{pattern}' (expected one of {', '.join(PATTERNS)})")
    if n_pes < 2:
        raise ValueError("traffic needs at least two PEs")
    if messages < 1:
        raise ValueError(f"--messages must be at least 1, got {messages}")
    rng = random.Random(seed)
    pairs = []
    for i in range(messages):
        if pattern == "transpose":
            src = i % n_pes
            pairs.append((src, _transpose(src, n_pes)))
            continue
        src = rng.randrange(n_pes)
        if pattern == "hotspot" and src != 0 and rng.random() < 0.25:
            pairs.append((src, 0))
            continue
        dst = rng.randrange(n_pes - 1)
        pairs.append((src, dst + (dst >= src)))
    return pairs


def pattern_messages(machine, pattern: str, messages: int, nbytes: int, seed: int) -> list[tuple[str, str, int]]:
    """``(src node, dst node, nbytes)`` for ``Simulator.run_messages``."""
    if nbytes < 1:
        raise ValueError(f"--bytes must be at least 1, got {nbytes}")
    pes = machine.pes
    return [(pes[s].node("dma_wr"), pes[d].node("dma_rd"), nbytes)
            for s, d in pattern_pairs(pattern, len(pes), messages, seed)]
