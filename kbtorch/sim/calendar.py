"""A link's committed future: piecewise-constant utilisation over time.

A train committed on a link uses a fraction of the link between its first flit's arrival
and its last flit's departure: all of it when the link is its bottleneck, less when its
flits arrive spaced out (a 256 GB/s stream on a 512 GB/s link uses half). A train that
arrives later fills the capacity left over, in the gaps between the flits of the trains
before it, instead of waiting for them to finish: two half-rate streams share a link at
full speed, two full-rate streams get half each.

Segment ``i`` spans ``[ts[i], ts[i+1])`` with utilisation ``us[i]`` in [0, 1]; after the
last boundary the link is idle. Times are ps (floats inside, rounded up by the caller).
"""
from __future__ import annotations

from bisect import bisect_right
from math import ceil


def forget(ts: list, us: list, now) -> None:
    """Drop segments that ended at or before ``now``."""
    k = 0
    while k + 1 < len(ts) and ts[k + 1] <= now:
        k += 1
    if k:
        del ts[:k]
        del us[:k]


def avail(ts: list, us: list, h, first, work) -> tuple:
    """Earliest times by which ``first`` and ``work`` ps of service (``first <= work``: a
    train's first flit and its whole train) fit into the spare capacity from ``h``, in one pass.

    NOTE: the search starts at the segment holding ``h`` (bisection): a link reserved far
    ahead (sprayed traffic) has a long calendar, most of it before ``h``."""
    x, got = h, None
    for i in range(max(0, bisect_right(ts, h) - 1), len(us)):
        u, t1 = us[i], ts[i + 1]
        if t1 <= x:
            continue
        t0 = ts[i] if ts[i] > x else x
        if u < 1.0:
            cap = (1.0 - u) * (t1 - t0)
            if got is None:
                if cap >= first:
                    got = t0 + first / (1.0 - u)
                else:
                    first -= cap
            if cap >= work:
                return got, t0 + work / (1.0 - u)
            work -= cap
        x = t1
    return (x + first if got is None else got), x + work


def occupy(ts: list, us: list, h, t_end, work) -> None:
    """Commit ``work`` ps of service spread over the spare capacity of ``[h, t_end)``.

    Requires ``ts[0] <= h`` (segments never start in the future of a new train)."""
    if t_end > ts[-1]:
        ts.append(t_end)
        us.append(0.0)
    i0, i1 = _cut(ts, us, h), _cut(ts, us, t_end)
    spare = 0.0
    for i in range(i0, i1):
        spare += (1.0 - us[i]) * (ts[i + 1] - ts[i])
    f = work / spare if spare > work else 1.0
    for i in range(i0, i1):
        us[i] += f * (1.0 - us[i])
    i, stop = min(len(us), i1 + 1) - 1, max(0, i0 - 1)
    while i > stop:
        if us[i] == us[i - 1]:
            del us[i]
            del ts[i]
        i -= 1


def _cut(ts: list, us: list, t) -> int:
    """Make ``t`` a segment boundary; return its index in ``ts``."""
    i = bisect_right(ts, t) - 1
    if ts[i] != t:
        ts.insert(i + 1, t)
        us.insert(i + 1, us[i])
        i += 1
    return i


def serialise(ts: list, us: list, head: int, tail: int, n: int, ser: int, now=None) -> tuple[int, int]:
    """Serialise a train of ``n`` flits of ``ser`` ps each (first flit at ``head``, last at
    ``tail``) on a link whose calendar ``ts``/``us`` has committed use after ``head``;
    -> (its first flit out, its last flit out).

    ``now``: reservation mode, where commitments may lie before ``head``; only the past
    before ``now`` is forgotten."""
    if now is not None:
        if not ts or ts[-1] <= head:
            return _append(ts, us, head, tail, n, ser, now)
        if head < ts[0]:
            ts.insert(0, head)
            us.insert(0, 0.0)
        forget(ts, us, min(now, head))
        if not us:
            ts.append(head)
            us.append(0.0)
        first, last = avail(ts, us, head, ser, n * ser)
        head_out, tail_out = ceil(first), max(ceil(last), tail + ser)
        occupy(ts, us, head, tail_out, n * ser)
        return head_out, tail_out
    if len(us) == 1 and us[0] >= 1.0:
        end = ts[1]
        head_out, tail_out = end + ser, max(end + n * ser, tail + ser)
        if tail_out == end + n * ser:
            ts[1] = tail_out
        else:
            ts.append(tail_out)
            us.append(n * ser / (tail_out - end))
        return head_out, tail_out
    forget(ts, us, head)
    first, last = avail(ts, us, head, ser, n * ser)
    head_out, tail_out = ceil(first), max(ceil(last), tail + ser)
    occupy(ts, us, head, tail_out, n * ser)
    return head_out, tail_out


def _append(ts: list, us: list, head: int, tail: int, n: int, ser: int, now: int) -> tuple[int, int]:
    """Reservation mode, a link idle from ``head`` on: commit the train after the calendar
    (keeping the past a later reservation may still fill; trimmed once it is long)."""
    tail_out = max(tail + ser, head + n * ser)
    if ts and ts[-1] < head:
        us.append(0.0)
        ts.append(head)
    elif not ts:
        ts.append(head)
    us.append(n * ser / (tail_out - head))
    ts.append(tail_out)
    if len(ts) > 64:
        forget(ts, us, min(now, head))
    return head + ser, tail_out
