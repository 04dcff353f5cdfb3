"""Helpers shared by the ``kbtorch`` command-line modules: PE arguments, run summaries, traces."""
from __future__ import annotations

from .profiler import breakdown_ns
from .units import parse_pe, parse_pes


def _write_trace(args, result) -> None:
    """Write the run's trace (one tab-separated record a line, times in ps) to ``--trace``."""
    if not args.trace:
        return
    try:
        with open(args.trace, "w") as fh:
            fh.write("# start_ps\tend_ps\tcorr\telement\twhat\tdetail\n")
            fh.writelines(line + "\n" for line in result.trace)
    except OSError as exc:
        raise ValueError(f"argument --trace: cannot write '{args.trace}': {exc.strerror}") from None


def _run_info(result) -> dict:
    return {"latency_ns": result.latency_ns, "breakdown": breakdown_ns(result),
            "events": result.events, "wall_s": result.wall_s}


def _pe_arg(text: str, n_pes: int, option: str) -> int:
    try:
        return parse_pe(text, n_pes)
    except ValueError as exc:
        raise ValueError(f"argument {option}: {exc}") from None


def _pes_arg(text: str, n_pes: int) -> list[int]:
    try:
        return parse_pes(text, n_pes)
    except ValueError as exc:
        raise ValueError(f"argument --pes: {exc}") from None
