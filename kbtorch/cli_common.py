"""Helpers shared by the ``kbtorch`` command-line modules: PE arguments, run summaries, traces."""
from __future__ import annotations

import argparse
import math

from .profiler import breakdown_ns
from .units import parse_bytes, parse_int, parse_pe, parse_pes


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


def _byte_count(text: str) -> int:
    try:
        return parse_bytes(text, minimum=1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int(text: str) -> int:
    try:
        return parse_int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' must be a positive integer")
    return value


def _nonneg_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be a non-negative integer")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"invalid number '{text}' (a finite decimal number, e.g. 0.5)")
    return value


def _triple(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        values = tuple(parse_int(x) for x in parts)
    except ValueError:
        values = ()
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"invalid triple '{text}' (expected three integers such as 128,128,512)")
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' must be three positive integers")
    return values
