"""Helpers shared by the ``kbtorch`` command-line modules: PE arguments, run summaries, traces."""
from __future__ import annotations

import argparse
import math
import os

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


def positive_float(what: str = "a positive number"):
    """An argparse ``type``: a finite float above 0, else an error saying the text is not ``what``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"'{text}' is not {what}")
        return value
    return parse


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


#: The first bytes of each kind of file a command writes or reads -> what to call it.
_MAGIC = ((b"SQLite format 3\x00", "sqlite", "an SQLite database"), (b"PAR1", "parquet", "a Parquet file"),
          (b"\x89PNG", "png", "a PNG image"), (b"# start_ps", "trace", "an event trace"),
          (b"key,workload", "csv", "a CSV export of a sweep"), (b"| workload", "md", "a markdown export of a sweep"),
          (b"id,replica,status", "requests", "a per-request CSV of kbtorch serve"),
          (b'{"traceEvents"', "chrome", "a Chrome trace"))


def _file_kind(path: str) -> tuple[str, str]:
    """(kind, description) of an existing file, from its first bytes."""
    with open(path, "rb") as fh:
        head = fh.read(64)
    for magic, kind, what in _MAGIC:
        if head.startswith(magic):
            return kind, what
    return "other", "a file of another kind (not one this option writes)"


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def check_output(path: str, option: str, inputs: dict, kind: str) -> None:
    """ValueError naming ``option`` unless writing ``path`` loses no input: it is none of
    ``inputs`` (``{path: what it is}``, e.g. the store, the sweep spec, a topology or chip
    file the run reads), and an existing non-empty file there is of the ``kind`` this option
    writes (``trace``, ``csv``, ``md``, ``parquet``): a command overwrites only its own kind."""
    for other, what in inputs.items():
        if other and _same_file(path, other):
            raise ValueError(f"argument {option}: '{path}' is {what} (an output never overwrites an input; "
                             f"give another path)")
    if os.path.isfile(path) and os.path.getsize(path):
        try:
            found, what = _file_kind(path)
        except OSError as exc:
            raise ValueError(f"argument {option}: cannot read '{path}': {exc.strerror}") from None
        if found != kind:
            raise ValueError(f"argument {option}: '{path}' exists and is {what}, not a {kind} file as {option} "
                             f"writes: move it away or give another path")


def topology_inputs(paths) -> dict:
    """``{file: what}`` of every topology file (and a system's chip file) of ``paths``."""
    from .topology.load.sources import source_files
    out = {}
    for path in paths:
        files = source_files(path)
        out[files[0]] = f"the topology file {os.path.basename(files[0])} the run reads"
        for chip in files[1:]:
            out[chip] = f"the chip file {os.path.basename(chip)} of the system {os.path.basename(files[0])}"
    return out
