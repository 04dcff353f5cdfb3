"""Collectives on the simulated PEs: all-reduce, reduce-scatter, all-gather, broadcast,
all-to-all, one op family each (registered here).

Two independent passes over one schedule (``schedules``): the numeric pass interprets it on
torch tensors (each member's shard), the timing pass runs the collective tile kernel
(``kernel``) on the simulator (``simulate``). Algorithms are registered by decorator, one
module each (``algorithms/``); ``algo="auto"`` picks, like NCCL's tuner, the algorithm with
the least predicted time (``choice``). Groups side by side: ``side_by_side``.

The order inside the package (tests/test_imports.py): ``request`` and ``steps`` -> the
algorithms -> ``groups``, ``schedules`` -> the kernel (``kernel_layout``, ``multicast``,
``kernel``), its models (``analytic``) and ``rename`` -> ``build`` -> ``choice`` -> ``units``
-> ``simulate`` -> ``side_by_side`` -> the package.
"""
from __future__ import annotations

from functools import partial

import torch

from ...kernel.door import MODES
from ..contract import DTYPES, OpFamily, Param, Sample, as_machine, register
from .algorithms import ALGOS, LINE_ALGOS
from .choice import estimates
from .groups import resolve_group
from .request import KINDS, OPS, CollectiveError, Request
from .side_by_side import concurrent, concurrent_run, line_algo, on_groups, on_groups_run
from .simulate import BUS_FACTOR, CollectiveRun, checked, checked_across, collective

__all__ = ["ALGOS", "BUS_FACTOR", "KINDS", "LINE_ALGOS", "CollectiveError", "CollectiveRun", "Request", "all_gather",
           "all_reduce", "all_to_all", "broadcast", "collective", "concurrent", "concurrent_run", "estimates",
           "line_algo", "on_groups", "on_groups_run", "reduce_scatter", "torch_reference"]


def all_reduce(shards=None, **kw) -> CollectiveRun:
    """Every member ends with the reduction (``op``: sum or max) of all members' buffers."""
    return collective("all_reduce", shards, **kw)


def reduce_scatter(shards=None, **kw) -> CollectiveRun:
    """Member i ends with block i of the reduction (torch's ``reduce_scatter_tensor`` order)."""
    return collective("reduce_scatter", shards, **kw)


def all_gather(shards=None, **kw) -> CollectiveRun:
    """Every member ends with the concatenation of all members' shards, in member order."""
    return collective("all_gather", shards, **kw)


def broadcast(shards=None, **kw) -> CollectiveRun:
    """Every member ends with the buffer of member ``root``."""
    return collective("broadcast", shards, **kw)


def all_to_all(shards=None, **kw) -> CollectiveRun:
    """Member d ends with block d of every member's buffer, in member order (torch's
    ``all_to_all_single`` with equal splits)."""
    return collective("all_to_all", shards, **kw)


def torch_reference(kind: str, shards: list, op: str = "sum", root: int = 0) -> list:
    """What torch.distributed would return on each member, computed directly."""
    n = len(shards)
    if kind == "all_to_all":
        return [torch.cat([s.reshape(-1).chunk(n)[d] for s in shards]) for d in range(n)]
    if kind == "all_gather":
        return [torch.cat([s.reshape(-1) for s in shards])] * n
    if kind == "broadcast":
        return [shards[root].reshape(-1)] * n
    acc = shards[0].reshape(-1).float()
    for s in shards[1:]:
        acc = OPS[op](acc, s.reshape(-1).float())
    acc = acc.to(shards[0].dtype)
    return [acc] * n if kind == "all_reduce" else list(acc.chunk(n))


def _timing(kind: str):
    def run(machine=None, nbytes=1 << 20, **kw) -> CollectiveRun:
        return collective(kind, machine=machine, nbytes=nbytes, **kw)
    return run


def _check(kind: str):
    def check(machine=None, nbytes=1 << 20, group="all", op="sum", root=0, dtype="f16", packet_bytes=None,
              mode="auto", order="rank", **_) -> None:
        """The timing-only run's checks before any work (one group, or units ``across:LEVEL``)."""
        req = Request(kind, as_machine(machine), group=group, op=op, root=root, nbytes=nbytes, dtype=dtype,
                      packet_bytes=packet_bytes, mode=mode, order=order)
        (checked_across if isinstance(group, str) and group.startswith("across:") else checked)(req)
    return check


def _numeric(kind: str):
    def numeric(machine=None, nbytes=1 << 20, group="all", dtype="f16", op="sum", **kw) -> tuple:
        """(run, every member's output, ``torch_reference``'s): the family on seeded random shards."""
        n = len(resolve_group(as_machine(machine), group))
        g = torch.Generator().manual_seed(0)
        count = nbytes // DTYPES[dtype].bytes // (n if kind == "all_gather" else 1)
        shards = [torch.randn(count, generator=g).to(DTYPES[dtype].torch) for _ in range(n)]
        run = collective(kind, shards, group=group, op=op, machine=machine, **kw)
        got, want = (torch.cat([t.reshape(-1) for t in out])
                     for out in (run.outputs, torch_reference(kind, shards, op)))
        return run, got, want
    return numeric


# NOTE: tolerance: the alpha-beta estimate against the simulation of the samples, worst -36%
# (all-gather, ring over 4 PEs of tiny, 64 KiB; the others within 31%): steps overlap in the
# simulation, not in the estimate. atol: a sum of 8 f16 members rounded in another order.
for _kind in KINDS:
    register(OpFamily(_kind, _timing(_kind), partial(torch_reference, _kind), (
        Param("nbytes", "bytes", required=True, help="bytes per member (nccl-tests' count)"),
        Param("group", "str", "all", "all, a topology level (cube, sip, cube:N) or a PE list"),
        Param("algo", "str", "auto", choices=("auto", *ALGOS)), Param("op", "str", "sum", choices=tuple(OPS)),
        Param("dtype", "dtype", "f16"), Param("mode", "str", "auto", choices=("auto", *MODES))),
        help=f"collective {_kind}",
        samples=(Sample(dict(nbytes=65536)),
                 Sample(dict(nbytes=65536, group="0-3", algo="ring", op="max", dtype="fp32"))),
        bad=(Sample(dict(nbytes=0), "nbytes"), Sample(dict(nbytes=4097), "bytes"),
             Sample(dict(nbytes=4096, group="cube:99"), "group"), Sample(dict(nbytes=4096, algo="nope"), "algo")),
        tolerance=0.4, numeric=_numeric(_kind), atol=5e-2, check=_check(_kind)))
