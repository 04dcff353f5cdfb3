"""What a collective is asked: ``Request``, the one argument every step of a run takes (the
checks, the choice, the build, the numerics), with the known kinds, reductions and block
orders, and ``CollectiveError``."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..contract import DTYPES

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
ORDERS = ("rank", "grid")
OPS = {"sum": torch.add, "max": torch.maximum}


class CollectiveError(ValueError):
    """A collective that cannot be built as asked (names the argument at fault)."""


@dataclass(frozen=True)
class Request:
    """Collective ``kind`` over ``group`` on ``machine``: by ``algo`` (``auto``: the least
    predicted time, ``choice.choose``), reduction ``op``, broadcast ``root`` (a member rank),
    ``nbytes`` per member (nccl-tests' count) of ``dtype``, packets of ``packet_bytes``
    (None: from the block size), simulation ``mode`` and block ``order``
    (``schedules.schedule``); ``shards``: every member's tensor for the numeric pass (None:
    timing only); ``rounds``: build the kernel truncated to its first ``rounds`` rounds of
    packets and its last (``KernelLayout.truncate``; None: whole); ``fidelity``: ``auto``
    fast-forwards the rounds once they are steady (``kernel.steady``), ``exact`` simulates all. NOTE: ``nbytes`` and ``dtype`` as given until the checks resolve them
    (``simulate.checked``); a choice or a line's build takes a copy with its own ``algo`` or
    share (``dataclasses.replace``)."""

    kind: str
    machine: object = None
    group: object = "all"
    algo: str = "auto"
    op: str = "sum"
    root: int = 0
    nbytes: int | None = None
    dtype: str = "f16"
    packet_bytes: int | None = None
    mode: str = "auto"
    order: str = "rank"
    shards: list | None = field(default=None, repr=False, compare=False)
    rounds: int | None = None
    fidelity: str = "auto"

    @property
    def elem_bytes(self) -> int:
        return DTYPES[self.dtype].bytes
