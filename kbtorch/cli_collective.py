"""``kbtorch bench allreduce|allgather|reducescatter|broadcast|alltoall``: a simulated collective with
its bandwidths, bound and analytic estimate and, with ``--check``, a comparison against what
torch.distributed would return."""
from __future__ import annotations

import argparse

from tabulate import tabulate

from .cli_common import _byte_count, _nonneg_int
from .ops.collective.algorithms import ALGOS
from .ops.contract import DTYPES
from .units import fmt_bytes

#: Subcommand -> collective kind of ``kbtorch.ops.collective``.
COLLECTIVES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "broadcast": "broadcast", "alltoall": "all_to_all"}
REDUCING = ("all_reduce", "reduce_scatter")
#: The registered algorithms (``ops.collective.algorithms``) and ``auto``.
COLLECTIVE_ALGOS = (*ALGOS, "auto")
COLLECTIVE_OPS = ("sum", "max")
COLLECTIVE_MODES = ("auto", "fast", "coarse", "flit")
#: ``--check`` tolerances (atol per member, rtol): atol is multiplied by the number of members.
COLLECTIVE_TOLERANCE = {"f16": (1e-2, 1e-2), "bf16": (1e-2, 1e-2), "fp32": (1e-5, 1e-5)}
COLLECTIVE_HELP = """\
Simulate a collective over the members of --group and report, as nccl-tests does, the
latency, the algorithm bandwidth (--bytes / latency) and the bus bandwidth (algbw x 2(n-1)/n
for all-reduce, x (n-1)/n for reduce-scatter and all-gather, x 1 for broadcast); next to it
the bound (the larger of the startup latency and the busiest resource's time), the
bottleneck, and the step-by-step alpha-beta estimate.

--bytes is the per-member buffer as nccl-tests counts it: the whole tensor of an all-reduce,
the input of a reduce-scatter, the gathered output of an all-gather, the broadcast buffer,
the input (= output) of an all-to-all (bus bandwidth x (n-1)/n).
--group is all, a level of the topology (cube, sip, ...; cube:3 for the fourth), a PE
list such as 0-7,16, or across:chip (across:chip:K) on a system of chips: the chips are the
members, --bytes is per chip, and all (K) PEs of each chip carry one share of its data.
--algo auto picks the algorithm with the least predicted time.

The run is timing-only unless --check is given: then every member's buffer is random
(torch.manual_seed(0), randn in --dtype), the collective also runs on the data and every
member's output is compared with the torch reference (atol: f16 and bf16 1e-2, fp32 1e-5,
times the number of members; rtol: f16 and bf16 1e-2, fp32 1e-5).
"""


def add_parser(bench, parents, family) -> None:
    """Declare the subcommand of one collective (``allreduce`` for the family ``all_reduce``)."""
    kind = family.name
    for name in [n for n, k in COLLECTIVES.items() if k == kind]:
        p = bench.add_parser(name, parents=parents, help=f"{kind.replace('_', '-')} over a group of PEs",
                             description=COLLECTIVE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--bytes", type=_byte_count, required=True, help="per-member buffer (e.g. 64KiB)")
        p.add_argument("--algo", choices=COLLECTIVE_ALGOS, default="auto", help="algorithm (default auto)")
        p.add_argument("--group", default="all", help="members: all, cube, sip, cube:3, 0-7,16... (default all)")
        if kind in REDUCING:
            p.add_argument("--op", choices=COLLECTIVE_OPS, default="sum", help="reduction (default sum)")
        if kind == "broadcast":
            p.add_argument("--root", type=_nonneg_int, default=0,
                           help="rank in --group (0..members-1) of the member that sends (default 0)")
        p.add_argument("--dtype", choices=tuple(DTYPES), default="f16", help="element type (default f16)")
        p.add_argument("--packet-bytes", type=_byte_count, help="packet size (default: from the block size)")
        p.add_argument("--mode", choices=COLLECTIVE_MODES, default="auto",
                       help="simulation mode (default auto: coarse for very large runs or kernels, else fast)")
        p.add_argument("--check", action="store_true", help="also run on random data and compare with torch")
        p.set_defaults(func=_cmd_collective, collective=kind)


def _members(args, machine) -> int:
    """The number of members; raises ValueError naming the argument at fault."""
    from .ops.collective.groups import make_grid, resolve_group
    from .ops.collective.kernel_layout import padded_bytes
    from .ops.collective.request import CollectiveError
    from .ops.collective.schedules import schedule

    kind, root = args.collective, getattr(args, "root", 0)
    if args.group.startswith("across:"):
        from .ops.collective.units import parse, units
        try:
            return len(units(machine, *parse(args.group)))
        except CollectiveError as exc:
            raise ValueError(f"argument --group: {exc}") from None
    try:
        pes = resolve_group(machine, args.group)
    except CollectiveError as exc:
        raise ValueError(f"argument --group: {exc}") from None
    n = len(pes)
    if not 0 <= root < n:
        raise ValueError(f"argument --root: {root} is not a member rank of the group of {n} (0..{n - 1})")
    eb = DTYPES[args.dtype].bytes
    elems = args.bytes // eb
    if args.bytes % eb:
        raise ValueError(f"argument --bytes: {args.bytes} bytes is not a whole number of {args.dtype} "
                         f"elements ({eb} bytes each)")
    if kind in ("all_gather", "all_to_all") and elems % n:
        what = "gathered" if kind == "all_gather" else "exchanged"
        raise ValueError(f"argument --bytes: the {what} {elems} {args.dtype} elements do not split into "
                         f"{n} equal shards")
    if args.algo != "auto":
        try:
            sched = schedule(kind, args.algo, make_grid(machine, pes), root)
        except CollectiveError as exc:
            raise ValueError(f"argument --algo: {exc}") from None
        if padded_bytes(sched, args.bytes, eb) is None:
            raise ValueError(f"argument --bytes: {args.bytes} bytes ({elems} {args.dtype} elements) do not split "
                             f"into the {sched.blocks} equal blocks of {args.algo} {kind} over {n} members")
    return n


def _shards(kind: str, n: int, nbytes: int, dtype: str) -> list:
    """Random per-member buffers (seed 0): the input of each member, its shard for all-gather."""
    import torch

    torch.manual_seed(0)
    tdtype, eb = DTYPES[dtype].torch, DTYPES[dtype].bytes
    count = nbytes // eb // (n if kind == "all_gather" else 1)
    return [torch.randn(count, dtype=tdtype) for _ in range(n)]


def _check(run, kind: str, shards: list, op: str, root: int) -> dict:
    """Max abs error over members against torch_reference (in fp32), and allclose."""
    import torch

    from .ops.collective import torch_reference

    ref = torch_reference(kind, shards, op, root)
    atol, rtol = COLLECTIVE_TOLERANCE[run.dtype]
    atol *= len(shards)
    got = run.outputs or []
    same = len(got) == len(ref) and all(a.shape == b.shape for a, b in zip(got, ref))
    pairs = [(a.float(), b.float()) for a, b in zip(got, ref)] if same else []
    err = max((float((a - b).abs().max()) for a, b in pairs if a.numel()), default=0.0)
    close = same and all(torch.allclose(a, b, rtol=rtol, atol=atol) for a, b in pairs)
    return {"max_abs_err": err, "allclose": bool(close), "atol": atol, "rtol": rtol}


def _cmd_collective(args, machine):
    from .ops.collective import CollectiveError, collective

    if args.trace:
        raise ValueError("argument --trace: a collective writes no event trace (its figure comes from one "
                         "simulation or from fast-forwarded rounds); bench transfer, hbm, traffic, gemm, attention "
                         "and vector write one")
    kind, op, root = args.collective, getattr(args, "op", "sum"), getattr(args, "root", 0)
    n = _members(args, machine)
    shards = _shards(kind, n, args.bytes, args.dtype) if args.check else None
    try:
        run = collective(kind, shards, group=args.group, algo=args.algo, op=op, root=root, nbytes=args.bytes,
                         dtype=args.dtype, machine=machine, packet_bytes=args.packet_bytes, mode=args.mode)
    except CollectiveError as exc:
        text = str(exc)
        option = next((flag for word, flag in (("packet_bytes", "--packet-bytes"), ("root", "--root"),
                                               ("bytes", "--bytes")) if word in text), None)
        raise ValueError(f"argument {option}: {text}" if option else text) from None
    data = {"topology": machine.name, "group": args.group, **run.as_dict()}
    if args.check:
        data.update(_check(run, kind, shards, op, root))
    return data, _collective_text(data, args.algo)


def _candidates(d: dict) -> str:
    ranked = sorted(d["candidates_ns"].items(), key=lambda item: item[1])
    return ", ".join(f"{algo} {ns / 1000:.3f} us" for algo, ns in ranked)


def _obtained(o: dict) -> str:
    """How the figure was obtained (``kernel.steady.Obtained``), in one line."""
    if o["method"] == "simulated":
        return f"every event simulated (fidelity {o['fidelity']})"
    return (f"fast-forward (fidelity {o['fidelity']}): {o['events_simulated']} events simulated in runs of "
            f"{' and '.join(map(str, o['samples']))} rounds, {o['events_skipped']} skipped with "
            f"{o['repeats_skipped']} steady rounds ({o['skipped_ps'] / 1e6:,.3f} us); claimed error "
            f"<= {100 * o['error_bound']:.3f}%")


def _collective_text(d: dict, asked: str) -> str:
    us = d["latency_ns"] / 1000
    head = (f"{d['collective']} of {fmt_bytes(d['bytes'])} {d['dtype']} over {d['members']} members, {d['algo']} "
            f"({d['mode']} mode): {us:.3f} us, busbw {d['busbw_gbps']:.2f} GB/s")
    algo = d["algo"] if asked != "auto" else f"{d['algo']} (auto; estimates: {_candidates(d)})"
    what = d["collective"] + (f" (root {d['root']})" if d.get("root") is not None else "")
    what += f" ({d['op']})" if d["collective"] in REDUCING else ""
    rows = [
        ("collective", what), ("algorithm", algo), ("members", f"{d['members']} (group {d['group']})"),
        ("bytes", f"{d['bytes']} ({fmt_bytes(d['bytes'])} per member, {d['dtype']})"),
        ("latency", f"{us:.3f} us"), ("algbw", f"{d['algbw_gbps']:.2f} GB/s"),
        ("busbw", f"{d['busbw_gbps']:.2f} GB/s"),
        ("bound", f"{d['bound_ns']:,.1f} ns; the run reaches {d['pct_bound']:.1f}% of it"),
        ("startup bound", f"{d['startup_ns']:,.1f} ns"), ("bottleneck", d["bottleneck"]),
        ("analytic alpha-beta", f"{d['analytic_ns'] / 1000:.3f} us"),
        ("events", f"{d['events']} in {d['wall_s']:.3f} s wall"), ("obtained", _obtained(d["obtained"])),
    ]
    if "allclose" in d:
        verdict = "yes" if d["allclose"] else "NO"
        rows.append(("check vs torch", f"max abs err {d['max_abs_err']:.3g}, allclose {verdict} "
                                       f"(atol {d['atol']:.3g}, rtol {d['rtol']:g})"))
    else:
        rows.append(("numerics", "not run (timing only; --check to compare with torch)"))
    return "\n\n".join((head, tabulate(rows, disable_numparse=True)))
