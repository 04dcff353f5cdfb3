"""Parsing and formatting of the quantities users type: byte counts and PE lists.

Byte counts are plain integers or a number with a suffix: ``KiB``/``MiB``/``GiB`` are binary
(1024-based), ``KB``/``MB``/``GB`` decimal (1000-based), ``B`` is bytes. Suffixes are
case-insensitive; a fraction is allowed when the result is a whole number of bytes
(``1.5MiB``). PE lists are comma-separated ids and inclusive ranges (``0-3,8``). Integers
are plain ASCII decimal digits: ``1e3``, ``0x10`` and other scripts' digits are refused.
"""
from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
          "kb": 10**3, "mb": 10**6, "gb": 10**9}
# NOTE: ASCII digits only (re.ASCII): Python's \d and int() also take '١٢' or '１２'.
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$", re.ASCII)
_PE_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$", re.ASCII)
_INT = re.compile(r"^\s*[+-]?\d+\s*$", re.ASCII)


def parse_int(text) -> int:
    """An integer written in plain ASCII decimal digits (``1000``, ``-3``); ValueError naming
    the text for anything else (``1e3``, ``0x10``, ``1_000``, ``١٢``, ``5.0``)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    if not isinstance(text, str) or not _INT.match(text):
        raise ValueError(f"invalid integer '{text}' (plain decimal digits, e.g. 1000)")
    return int(text)


def parse_bytes(text, minimum: int = 0) -> int:
    """A byte count (int) from ``4096``, ``4KiB``, ``1.5MiB``, ``64KB``...; at least ``minimum``."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _BYTES.match(str(text))
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ValueError(f"invalid byte count '{text}' (use e.g. 4096, 64KiB, 1.5MiB, 2GiB, 64KB)")
        whole, _, frac = m.group(1).partition(".")
        scale = _UNITS[unit]
        numerator = int(whole + frac) * scale
        denominator = 10 ** len(frac)
        if numerator % denominator:
            raise ValueError(f"byte count '{text}' is not a whole number of bytes")
        value = numerator // denominator
    if value < minimum:
        raise ValueError(f"byte count '{text}' must be at least {minimum}")
    return value


def check_pe(pe: int, n_pes: int | None) -> int:
    """``pe`` if it is a PE of a machine of ``n_pes`` PEs (any PE if ``n_pes`` is None)."""
    if pe < 0 or (n_pes is not None and pe >= n_pes):
        limit = f"PEs 0..{n_pes - 1}" if n_pes else "no PEs"
        raise ValueError(f"PE {pe} does not exist ({limit})")
    return pe


def parse_pe(text, n_pes: int | None = None) -> int:
    """One PE id from ``text``, checked against ``n_pes``."""
    m = _PE_ITEM.match(str(text))
    if not m or m.group(2) is not None:
        raise ValueError(f"invalid PE '{text}' (expected a PE id such as 5)")
    return check_pe(int(m.group(1)), n_pes)


def parse_pes(text, n_pes: int | None = None) -> list[int]:
    """PE ids in the order given from ``0,5,9``, ``0-7`` or ``0-3,8``; no duplicates."""
    out: list[int] = []
    for item in str(text).split(","):
        m = _PE_ITEM.match(item)
        if not m:
            raise ValueError(f"invalid PE list '{text}': '{item.strip()}' is not a PE id or range like 0-7")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"invalid PE list '{text}': range '{item.strip()}' runs backwards")
        for pe in range(lo, hi + 1):
            check_pe(pe, n_pes)
            if pe in out:
                raise ValueError(f"invalid PE list '{text}': PE {pe} is listed twice")
            out.append(pe)
    return out


def fmt_bytes(n: int) -> str:
    """``1048576`` -> ``1 MiB``; exact binary multiples get a suffix, other counts stay bytes."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % (scale // 4) == 0:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def fmt_ns(ns: float) -> str:
    """A duration given in ns, in ns below 10 us and in us above."""
    return f"{ns:,.3f} ns" if ns < 10_000 else f"{ns / 1000:,.3f} us"
