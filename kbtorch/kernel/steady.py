"""Steady states fast-forwarded: a program of many repeats simulated truncated, and advanced
by the repeats it skipped (``fidelity="auto"``), with a record of how every result was
obtained (``Obtained``).

A program that repeats one unit ``total`` times between a head and a tail (a collective's
rounds of packets) is simulated truncated to its first ``q`` repeats and its tail, its
commands marked with their repeat (``Command.mark``): the run keeps when each repeat's last
command completed. The repeats from ``FIRST`` on are steady when those times lie on a line:
the largest distance ``J`` of one from the least-squares line claims an error of
``J * (1 + 2 * skipped / span)`` where the line is carried past the ``span`` it was fitted
on by the ``skipped`` repeats (a line through points that each stray by at most ``J``
strays at most that much there). Where the claim is within ``BOUND`` of the latency, the
result is the truncated run advanced by ``skipped`` repeats at the line's slope: its
latency; its events, counters and PE finishes along their growth from the run of ``q // 2``
repeats (``HALF``) to this one; its attribution extended by the skipped time, shared among
the (element, cause) pairs the fitted repeats' time went to. Else ``q`` doubles, while the
runs cost at most ``COST`` of the whole; past it ``fast_forward`` gives None and the caller
simulates every event.

NOTE: this is simulation, not a formula: every figure comes from simulated runs of the very
program, under its whole concurrent mix; only repeats observed to be alike are skipped
(``docs/model.md``, fast-forward; ``docs/validation.md``, the table against ``exact``).
"""
from __future__ import annotations

import contextvars
import functools
from collections import Counter
from dataclasses import asdict, dataclass

from .. import state
from ..sim import blame

FIDELITIES = ("exact", "auto")
#: Repeats before the first fitted one: the pipeline's fill is simulated, not fitted.
FIRST = 4
#: The repeats of the first try (then doubled).
START = 16
#: The largest error a fast-forward may claim, relative to its latency.
BOUND = 0.005
#: The truncated runs may cost at most this share of the whole run's repeats.
COST = 0.5
_FIDELITY: contextvars.ContextVar = state.context_var("kbtorch_fidelity", "auto")


@dataclass(frozen=True)
class Obtained:
    """How a result was obtained: ``fidelity`` asked, ``method`` used (``simulated``: every
    event; ``fast-forward``: truncated runs advanced by whole repeats), events simulated and
    skipped, the repeats skipped and the latency they stand for, the samples and the claimed
    relative error bound."""

    fidelity: str
    method: str
    events_simulated: int
    events_skipped: int = 0
    repeats_skipped: int = 0
    skipped_ps: int = 0
    samples: tuple = ()          # the repeats of the truncated runs
    error_bound: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def check(fidelity: str | None) -> str:
    """``fidelity`` (None: the one in force, ``use_fidelity``), or a ValueError naming it."""
    if fidelity is None:
        return _FIDELITY.get()
    if fidelity not in FIDELITIES:
        raise ValueError(f"unknown fidelity {fidelity!r} (known: {', '.join(FIDELITIES)})")
    return fidelity


class use_fidelity:
    """``with use_fidelity("exact"):`` every run inside takes that fidelity (context-local)."""

    def __init__(self, fidelity: str):
        self.fidelity = check(fidelity)

    def __enter__(self) -> str:
        self._token = _FIDELITY.set(self.fidelity)
        return self.fidelity

    def __exit__(self, *exc) -> None:
        _FIDELITY.reset(self._token)


def current_fidelity() -> str:
    """The fidelity in force (``use_fidelity``; default ``auto``)."""
    return _FIDELITY.get()


def by_fidelity(maxsize: int):
    """``functools.lru_cache(maxsize)`` keyed by the fidelity in force too: a cached run of
    one fidelity is never the answer under another (``use_fidelity``). ``cache_clear`` and
    ``cache_info`` as lru_cache's (``state.cache`` registers it)."""
    def wrap(fn):
        @functools.lru_cache(maxsize=maxsize)
        def at(fidelity, *args, **kw):
            return fn(*args, **kw)

        @functools.wraps(fn)
        def cached(*args, **kw):
            return at(_FIDELITY.get(), *args, **kw)
        cached.cache_clear, cached.cache_info = at.cache_clear, at.cache_info
        return cached
    return wrap


def simulated(result, fidelity: str = "exact"):
    """``result``, a run with every event simulated, recorded as such."""
    result.obtained = Obtained(fidelity, "simulated", result.events)
    return result


def fast_forward(run_at, total: int, fidelity: str = "auto"):
    """The run of ``total`` repeats from truncated runs ``run_at(q)`` (RunResults with
    ``marks``), or None when no steady state is observed within the cost (see the module's
    docstring)."""
    runs: dict = {}
    q = START
    while sum(runs) + q + (q // 2 if q // 2 not in runs else 0) <= COST * total:
        runs[q] = run_at(q)
        got = _steady(runs[q], q, total)
        if got is None:
            return None
        if got[2] <= BOUND * got[1]:
            # NOTE: the run of q // 2 rounds (for the counters' growth) only once q is steady.
            if q // 2 not in runs:
                runs[q // 2] = run_at(q // 2)
            return _advanced(runs[q // 2], runs[q], q, total, got, list(runs.values()), fidelity)
        q *= 2
    return None


def _steady(run, q: int, total: int):
    """(slope ps per repeat, latency, claimed error ps, the fitted repeats' first and last
    marks' chains) of run ``run`` of ``q`` repeats; None if it is not steady: its repeats'
    ends do not rise, or stray too far for this try or any later one to claim ``BOUND``."""
    ks = list(range(FIRST, q))
    if any(k not in run.marks for k in ks):
        return None
    ts = [run.marks[k][0] for k in ks]
    km, tm = sum(ks) / len(ks), sum(ts) / len(ts)
    slope = sum((k - km) * (t - tm) for k, t in zip(ks, ts)) / sum((k - km) ** 2 for k in ks)
    stray = max(abs(t - (tm + slope * (k - km))) for k, t in zip(ks, ts))
    skipped = total - q
    latency = run.latency_ps + round(slope * skipped)
    claim = stray * (1 + 2 * skipped / (ks[-1] - ks[0]))
    if slope <= 0 or (claim > BOUND * latency and _hopeless(stray, latency, q, total)):
        return None
    return slope, latency, claim, run.marks[ks[0]][1], run.marks[ks[-1]][1]


def _hopeless(stray: float, latency: int, q: int, total: int) -> bool:
    """Whether no later try within the cost could claim ``BOUND`` if the repeats' ends
    stray as far as now (the runs of ``q`` and ``q // 2`` repeats made already)."""
    spent = q + q // 2
    while True:
        q *= 2
        spent += q
        if spent > COST * total:
            return True
        if stray * (1 + 2 * (total - q) / (q - 1 - FIRST)) <= BOUND * latency:
            return False


def _grown(first: int, last: int, span: int, skipped: int) -> int:
    """``last`` grown on by ``skipped`` repeats at its growth over the ``span`` from ``first``."""
    return last + round((last - first) * skipped / span)


def _advanced(half, run, q: int, total: int, got, every: list, fidelity: str):
    """Run ``run`` of ``q`` repeats advanced to ``total`` (see the module's docstring)."""
    _, latency, claim, chain0, chain1 = got
    span, skipped = q - q // 2, total - q
    extra = latency - run.latency_ps
    events = _grown(half.events, run.events, span, skipped)
    run.chain = attributed(chain0, chain1, run.chain, extra)
    run.latency_ps = latency
    run.stats = stats_grown(run.stats, half.stats, run.stats, skipped, span)
    run.pe_finish_ps = {pe: _grown(half.pe_finish_ps.get(pe, t), t, span, skipped) for pe, t in run.pe_finish_ps.items()}
    run.obtained = Obtained(fidelity, "fast-forward", sum(r.events for r in every), events - run.events,
                            skipped, extra, tuple(sorted(r for r in (q // 2, q))), claim / latency)
    run.events, run.wall_s, run.marks = events, sum(r.wall_s for r in every), {}
    return run


def attributed(first, last, chain, extra: int):
    """``chain`` extended by ``extra`` ps, shared among the (element, cause) pairs in
    proportion to their growth from chain ``first`` to ``last`` (largest remainders, in a
    fixed order): the skipped repeats' time goes where the simulated repeats' time went
    (here; graph mode's periodic blocks)."""
    a, b = _per_pair(first), _per_pair(last)
    grew = {k: v - a.get(k, 0) for k, v in b.items() if v > a.get(k, 0)} or dict(b)
    share = _shares(grew, extra)
    for element, cause in sorted(share, key=repr):
        chain = blame.extend(chain, element, cause, share[(element, cause)])
    return chain


def resized(chain, latency_ps: int):
    """``chain`` made to add up to ``latency_ps``: the difference given to (or taken from)
    its (element, cause) pairs in proportion to their time, as ``attributed`` shares it (a
    run re-timed from another: graph mode's ``retimed``)."""
    ps = latency_ps - blame.total(chain)
    if ps >= 0:
        return attributed(None, chain, chain, ps)
    cut = _shares(_per_pair(chain), -ps)
    out = None
    for element, cause, seg in blame.segments(chain):
        take = min(seg, cut.get((element, cause), 0))
        if take:
            cut[(element, cause)] -= take
        out = blame.extend(out, element, cause, seg - take)
    return out


def _shares(weights: dict, ps: int) -> dict:
    """``ps`` split among ``weights``' keys in proportion (largest remainders, ties by key)."""
    keys = sorted(weights, key=repr)
    whole = sum(weights.values())
    if not whole:
        return {}
    share = {k: ps * weights[k] // whole for k in keys}
    rest = ps - sum(share.values())
    for k in sorted(keys, key=lambda k: (-(ps * weights[k] % whole), repr(k)))[:rest]:
        share[k] += 1
    return share


def _per_pair(chain) -> Counter:
    out: Counter = Counter()
    for element, cause, ps in blame.segments(chain):
        out[(element, cause)] += ps
    return out


def stats_grown(stats, first, last, times: int, span: int = 1):
    """Counters ``stats`` grown leaf by leaf by ``times / span`` their growth from snapshot
    ``first`` to ``last`` (a leaf missing from ``first`` grew from 0; a leaf not a number in
    ``stats`` and ``last`` stays as in ``stats``): the skipped repeats' counters (here, with
    ``stats`` the run of ``last``; graph mode's periodic blocks)."""
    if isinstance(stats, dict):
        first, last = (x if isinstance(x, dict) else {} for x in (first, last))
        return {k: stats_grown(v, first.get(k, 0), last.get(k), times, span) for k, v in stats.items()}
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in (stats, last)):
        return stats
    if isinstance(stats, float):
        return stats + (last - first) * times / span
    return stats + round((last - (first if isinstance(first, int) else 0)) * times / span)
