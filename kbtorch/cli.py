"""The ``kbtorch`` command line: topology summaries and micro-benchmarks of the simulator.

Every command takes ``--json`` (print exactly one JSON object on stdout) and ``--topology
NAME|PATH`` (default ``ahbm``). Byte counts accept KiB/MiB/GiB suffixes, PE lists ``0,5,9``
and ``0-7``, triples (GEMM tiles and grids) ``128,128,512``. An error prints ``kbtorch:
error: <message>`` on stderr and exits with 2; a sweep some of whose points failed prints its
results and exits with 1.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys

from tabulate import tabulate

from . import limits
from .kernel import FIDELITIES, use_fidelity
from .profiler import breakdown_table, path_table
from .runtime import AllocationError, Runtime
from .kernel.door import PATTERNS, Dma, pattern_messages, pattern_pairs, simulator
from .topology.machine import load_machine
from .topology.select import current_machine
from .cli_common import (_byte_count, _nonneg_int, _pe_arg, _pes_arg, _positive_int, _run_info, _write_trace,
                         check_output, topology_inputs)
from .cli_ops import add_family_parsers
from .cli_serve import add_parser as add_serve_parser
from .cli_sweep import add_parser as add_sweep_parser
from .units import fmt_bytes, fmt_ns

HBM_PATTERNS = ("uniform", "hot-channel")
EXAMPLE_BYTES = 1 << 20
class UsageError(Exception):
    """A bad command line, reported as ``kbtorch: error: ...``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


#: The parser of kbtorch's command line and example scripts: a bad argument raises UsageError.
ArgumentParser = _Parser
#: What a command or a script reports as an error (one line, exit 2) rather than a traceback.
REPORTED = (UsageError, ValueError, TypeError, KeyError, RuntimeError, OSError)


def _common() -> argparse.ArgumentParser:
    """Options every command accepts; SUPPRESS keeps a subcommand from resetting them."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON object")
    p.add_argument("--topology", metavar="NAME|PATH", default=argparse.SUPPRESS, help="topology (default: ahbm)")
    p.add_argument("--fidelity", choices=FIDELITIES, default=argparse.SUPPRESS,
                   help="auto (default): steady rounds fast-forwarded; exact: every event simulated")
    return p


def _bench_parsers(bench, common) -> None:
    run = argparse.ArgumentParser(add_help=False)
    run.add_argument("--trace", metavar="PATH", help="write the event trace to PATH")
    p = bench.add_parser("transfer", parents=[common, run], help="DMA from one PE's HBM slice to another's")
    p.add_argument("--src", required=True, help="source PE")
    p.add_argument("--dst", required=True, help="destination PE")
    p.add_argument("--bytes", type=_byte_count, default=EXAMPLE_BYTES, help="bytes to move (default 1MiB)")
    p.add_argument("--flit-exact", action="store_true", help="one event per flit (reference mode)")
    p.set_defaults(func=_cmd_transfer)
    p = bench.add_parser("hbm", parents=[common, run], help="PEs stream from their HBM slice into their TCM")
    p.add_argument("--pes", default="0-7", help="PE list (default 0-7)")
    p.add_argument("--bytes", type=_byte_count, default=EXAMPLE_BYTES, help="bytes per PE (default 1MiB)")
    p.add_argument("--pattern", choices=HBM_PATTERNS, default="uniform")
    p.set_defaults(func=_cmd_hbm)
    p = bench.add_parser("traffic", parents=[common, run], help="synthetic PE-to-PE messages")
    p.add_argument("--pattern", choices=PATTERNS, default="uniform")
    p.add_argument("--messages", type=_positive_int, default=64, help="number of messages (default 64)")
    p.add_argument("--bytes", type=_byte_count, default=64 << 10, help="bytes per message (default 64KiB)")
    p.add_argument("--seed", type=_nonneg_int, default=0)
    p.add_argument("--flit-exact", action="store_true", help="one event per flit (reference mode)")
    p.set_defaults(func=_cmd_traffic)
    add_family_parsers(bench, [common, run])


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = _Parser(prog="kbtorch", parents=[common], description=__doc__.split("\n")[0])
    parser.set_defaults(func=_cmd_default)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("topo", parents=[common], help="summary of a compiled topology")
    p.add_argument("name", nargs="?", metavar="NAME|PATH", help="topology (default: --topology or ahbm)")
    p.set_defaults(func=_cmd_topo)
    bench = sub.add_parser("bench", help="micro-benchmarks").add_subparsers(dest="bench", metavar="BENCH", required=True)
    _bench_parsers(bench, common)
    add_sweep_parser(sub, common)
    add_serve_parser(sub, common)
    return parser


def main(argv=None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); -> exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        limits.check_environment()
        args = build_parser().parse_args(argv)
        machine = _machine(args) if getattr(args, "needs_machine", True) else None
        if getattr(args, "trace", None) is not None:
            check_output(args.trace, "--trace", topology_inputs([machine.path]), "trace")
        with use_fidelity(args.fidelity) if hasattr(args, "fidelity") else contextlib.nullcontext():
            data, text = args.func(args, machine)
    except (*REPORTED, MemoryError, KeyboardInterrupt) as exc:
        return report(exc, wants_json(argv))
    try:
        print(json.dumps(_finite(data)) if getattr(args, "json", False) else text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return getattr(args, "status", 0)


def _machine(args):
    """The machine a command runs on: its NAME or ``--topology``, else $KBTORCH_TOPOLOGY, else ahbm."""
    name = getattr(args, "name", None) or getattr(args, "topology", None)
    return load_machine(name) if name else current_machine()


def wants_json(argv: list) -> bool:
    """Whether ``argv`` asks for JSON: ``--json`` or an abbreviation argparse takes for it
    (``--js``), so an error is one JSON object whenever a success would be."""
    return any(len(a) > 3 and "--json".startswith(a) for a in argv)


def report(exc: BaseException, as_json: bool, prog: str = "kbtorch") -> int:
    """The exit status of a command or script that raised ``exc``, reported by :func:`fail`."""
    if isinstance(exc, KeyboardInterrupt):
        return fail(exc, as_json, str(exc) or "stopped by Ctrl-C", 130, prog)
    if isinstance(exc, MemoryError) and not str(exc):
        return fail(exc, as_json, "out of memory (the input asks for more than this machine holds)", 2, prog)
    return fail(exc, as_json, exc.args[0] if isinstance(exc, KeyError) and exc.args else exc, 2, prog)


def run_script(main, argv=None, prog: str | None = None) -> int:
    """Run an example script's ``main(argv)``; a bad input or a fault is reported as the
    command line does (one line on stderr, one JSON object under ``--json``, exit 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        limits.check_environment()
        return main(argv) or 0
    except (*REPORTED, MemoryError, KeyboardInterrupt) as exc:
        return report(exc, wants_json(argv), prog or os.path.basename(sys.argv[0]) or "kbtorch")


def fail(exc: BaseException, as_json: bool, message, status: int = 2, prog: str = "kbtorch") -> int:
    """Report an error as every command does: ``PROG: error: MESSAGE`` on stderr (one line of
    text, no traceback) and, under ``--json``, one object ``{"error": true, "kind", "message"}``
    on stdout -> the exit status (2: bad input; 130: interrupted)."""
    message = str(message)
    word = "interrupted" if status == 130 else "error"
    print(f"{prog}: {word}: {message}", file=sys.stderr, flush=True)
    if as_json:
        kind = "UsageError" if isinstance(exc, (UsageError, argparse.ArgumentError)) else type(exc).__name__
        print(json.dumps({"error": True, "kind": kind, "message": message}), flush=True)
    return status


def _finite(x):
    """``x`` with every non-finite float made None, so that the output is valid JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _topo_text(s: dict) -> str:
    overview = tabulate([
        ("topology", f"{s['name']} ({s['path']})"), ("PEs", s["pes"]),
        ("nodes / edges", f"{s['nodes']} / {s['edges']}"),
        ("peak (GEMM)", ", ".join(f"{d} {t:g} TFLOP/s" for d, t in s["peak_tflops"].items())),
        ("HBM bandwidth (aggregate)", f"{s['hbm_gbps_total']:g} GB/s"),
        ("HBM capacity", f"{s['hbm_gib_total']:g} GiB in {s['hbm_channels']} pseudo-channels"),
        ("SRAM capacity", f"{s['sram_mib_total']:g} MiB"),
        *([("chips", f"{s['chips']} x {s['chip']} ({s['trays']} trays x {s['chips_per_tray']}); switches: "
            + (", ".join(f"{t} {c}" for t, c in s["switches"].items()) or "none"))] if "chips" in s else []),
    ], disable_numparse=True)
    nodes = tabulate(sorted(s["nodes_by_kind"].items()), headers=("node kind", "count"))
    links = tabulate([(k, v["kind"], v["edges"], v["bw_gbps"], v["prop_ns"]) for k, v in s["links"].items()],
                     headers=("link", "kind", "edges", "GB/s", "prop ns"))
    return "\n\n".join((overview, nodes, links))


def _cmd_topo(args, machine):
    s = machine.summary()
    return s, _topo_text(s)


def _transfer(machine, src: int, dst: int, nbytes: int, mode: str = "fast", trace: bool = False):
    """DMA of ``nbytes`` from PE ``src``'s HBM slice to PE ``dst``'s -> (JSON dict, result)."""
    if src == dst:
        raise ValueError(f"--src and --dst are both PE {src}: a transfer needs two PEs")
    rt = Runtime(machine, mode=mode, trace=trace)
    a, b = rt.alloc(src, nbytes), rt.alloc(dst, nbytes)
    rt.launch(src, [Dma(a.loc(), b.loc(), nbytes, engine="dma_rd", label=f"transfer PE {src} -> PE {dst}")])
    result = rt.run()
    path = list(rt.last_sim.dma.data_path(a.node, b.node))
    data = {"topology": machine.name, "src": src, "dst": dst, "bytes": nbytes, "mode": mode,
            "gbps": nbytes / result.latency_ns, "path": path, **_run_info(result)}
    return data, result


def _transfer_text(machine, data: dict, result) -> str:
    head = (f"{fmt_bytes(data['bytes'])} from PE {data['src']} HBM to PE {data['dst']} HBM ({data['mode']} mode): "
            f"{fmt_ns(data['latency_ns'])}, {data['gbps']:.1f} GB/s, {len(data['path']) - 1} hops, "
            f"{data['events']} events in {data['wall_s']:.3f} s")
    return "\n\n".join((head, path_table(data["path"], machine), breakdown_table(result)))


def _cmd_transfer(args, machine):
    n = len(machine.pes)
    src, dst = _pe_arg(args.src, n, "--src"), _pe_arg(args.dst, n, "--dst")
    if args.flit_exact:
        limits.check("flits", -(-args.bytes // machine.flit_bytes), "argument --bytes with --flit-exact")
    data, result = _transfer(machine, src, dst, args.bytes, "flit" if args.flit_exact else "fast", bool(args.trace))
    _write_trace(args, result)
    return data, _transfer_text(machine, data, result)


def _cmd_default(args, machine):
    s = machine.summary()
    src, dst = 0, len(machine.pes) - 1
    if dst == src:
        return {"topology": s}, _topo_text(s)
    data, result = _transfer(machine, src, dst, EXAMPLE_BYTES)
    return {"topology": s, "example": data}, "\n\n".join(
        (_topo_text(s), "Example transfer: " + _transfer_text(machine, data, result)))


def _hbm_program(rt, pe: int, nbytes: int, pattern: str) -> Dma:
    """PE ``pe``'s DMA read from its HBM slice into its TCM; hot-channel strides the source so
    every burst maps to one pseudo-channel."""
    try:
        tcm = rt.alloc(pe, nbytes, "tcm")
    except AllocationError as exc:
        raise ValueError(f"argument --bytes: {fmt_bytes(nbytes)} does not fit the TCM: {exc}") from None
    p = rt.machine.node(rt.memory_node(pe, "hbm"))["params"]
    burst = p["burst_bytes"]
    stride = p["channels"] * burst if pattern == "hot-channel" else 0
    span = (-(-nbytes // burst) - 1) * stride + burst if stride else nbytes
    src = rt.alloc(pe, span, "hbm")
    return Dma(src.loc(), tcm.loc(), nbytes, engine="dma_rd", src_stride=stride, label=f"hbm {pattern} PE {pe}")


def _cmd_hbm(args, machine):
    pes = _pes_arg(args.pes, len(machine.pes))
    rt = Runtime(machine, trace=bool(args.trace))
    for pe in pes:
        rt.launch(pe, [_hbm_program(rt, pe, args.bytes, args.pattern)])
    result = rt.run()
    _write_trace(args, result)
    finish = {pe: result.pe_finish_ps[pe] / 1000 for pe in pes}
    # NOTE: a PE's own rate counts from its kernel launch; the whole kernel's from t = 0.
    start = {pe: machine.launch_ps(pe) / 1000 for pe in pes}
    data = {"topology": machine.name, "pes": pes, "bytes": args.bytes, "pattern": args.pattern,
            "gbps": len(pes) * args.bytes / result.latency_ns,
            "per_pe_gbps": {str(pe): args.bytes / (finish[pe] - start[pe]) for pe in pes},
            "launch_ns": {str(pe): start[pe] for pe in pes}, **_run_info(result)}
    head = (f"{len(pes)} PE(s) x {fmt_bytes(args.bytes)} HBM -> TCM, {args.pattern}: {data['gbps']:.1f} GB/s "
            f"in {fmt_ns(result.latency_ns)}, kernel launch included ({result.events} events in {result.wall_s:.3f} s)")
    rows = tabulate([(pe, machine.pes[pe].hbm, start[pe], finish[pe], args.bytes / (finish[pe] - start[pe]))
                     for pe in pes], headers=("PE", "HBM slice", "launched ns", "finish ns", "GB/s from launch"),
                    floatfmt=("", "", ".3f", ".3f", ".1f"))
    return data, "\n\n".join((head, rows, breakdown_table(result)))


def _cmd_traffic(args, machine):
    mode = "flit" if args.flit_exact else "fast"
    limits.check("messages", args.messages, "argument --messages")
    limits.check("flits", args.messages * -(-args.bytes // machine.flit_bytes), "arguments --messages x --bytes")
    msgs = pattern_messages(machine, args.pattern, args.messages, args.bytes, args.seed)
    pairs = pattern_pairs(args.pattern, len(machine.pes), args.messages, args.seed)
    with simulator(machine, mode=mode, trace=bool(args.trace)) as sim:
        result = sim.run_messages(msgs)
    _write_trace(args, result)
    finishes = [t / 1000 for t in result.finishes]
    data = {"topology": machine.name, "pattern": args.pattern, "bytes": args.bytes, "seed": args.seed,
            "mode": mode, "messages": [{"src": s, "dst": d, "bytes": args.bytes, "finish_ns": f}
                                       for (s, d), f in zip(pairs, finishes)], **_run_info(result)}
    ordered = sorted(finishes)
    head = (f"{args.messages} x {fmt_bytes(args.bytes)} {args.pattern} messages ({mode} mode): last finishes at "
            f"{fmt_ns(result.latency_ns)}; finish min / median / max {ordered[0]:.3f} / "
            f"{ordered[len(ordered) // 2]:.3f} / {ordered[-1]:.3f} ns; {result.events} events in {result.wall_s:.3f} s")
    return data, "\n\n".join((head, breakdown_table(result)))


if __name__ == "__main__":
    sys.exit(main())
