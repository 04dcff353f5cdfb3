"""The steady-state fast-forward (``kernel.steady``, ``fidelity="auto"``): what it gives
against every event simulated, that a wrong skip is caught, how each result says how it was
obtained, and where it declines."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kbtorch.kernel import FIDELITIES, run_programs, steady, use_fidelity
from kbtorch.ops.collective import CollectiveError, collective
from kbtorch.ops.collective.build import build
from kbtorch.ops.collective.groups import make_grid, resolve_group
from kbtorch.ops.collective.request import Request
from kbtorch.topology import load_machine

#: A ring all-gather of 256 packets per block (64 rounds) in fast mode: periodic to the ps.
CASE = dict(group="cube:0", algo="ring", machine="ahbm", nbytes=8 * 2**20, mode="fast", packet_bytes=4096)


@pytest.fixture(scope="module")
def both():
    return {f: collective("all_gather", fidelity=f, **CASE) for f in FIDELITIES}


def test_auto_gives_exacts_figures_with_fewer_events(both):
    auto, exact = both["auto"], both["exact"]
    got = auto.result.obtained
    assert (got.fidelity, got.method) == ("auto", "fast-forward")
    assert auto.result.latency_ps == exact.result.latency_ps
    assert auto.result.events == exact.result.events          # the skipped ones counted
    assert got.events_simulated < exact.result.events / 2
    assert got.events_simulated + got.events_skipped >= auto.result.events
    assert got.repeats_skipped > 0 and got.skipped_ps > 0 and got.error_bound == 0.0
    assert auto.result.stats["links"] == exact.result.stats["links"]
    assert auto.result.pe_finish_ps == exact.result.pe_finish_ps
    assert auto.as_dict()["obtained"]["method"] == "fast-forward"


def test_attribution_stays_whole_and_close(both):
    auto, exact = both["auto"].result, both["exact"].result
    a, e = auto.breakdown(), exact.breakdown()
    assert sum(a.values()) == auto.latency_ps
    assert max(abs(a.get(k, 0) - e.get(k, 0)) for k in set(a) | set(e)) <= 0.01 * exact.latency_ps


def _truncated():
    m = load_machine("ahbm")
    req = Request("all_gather", m, group="cube:0", algo="ring", nbytes=CASE["nbytes"], dtype="f16", packet_bytes=4096)
    grid = make_grid(m, resolve_group(m, "cube:0"))
    whole = build(req, grid)
    return whole.kernels[0].rounds - 1, lambda q: run_programs(build(replace(req, rounds=q), grid).programs, m,
                                                               mode="fast")


def test_a_skip_of_one_repeat_too_many_is_seen(both):
    total, run_at = _truncated()
    right = steady.fast_forward(run_at, total)
    wrong = steady.fast_forward(run_at, total + 1)
    assert right.latency_ps == both["exact"].result.latency_ps
    assert wrong.latency_ps != both["exact"].result.latency_ps


def test_exact_and_short_runs_simulate_every_event(both):
    assert both["exact"].result.obtained.method == "simulated"
    small = collective("all_gather", group="cube:0", algo="ring", machine="ahbm", nbytes=2**20)
    assert small.result.obtained == steady.Obtained("auto", "simulated", small.result.events)


def test_declines_where_repeats_stray():
    """Repeats whose ends wander: no claim within the bound, so no skip."""
    class Run:
        def __init__(self, q):
            self.marks = {k: (1000 * k + (0 if k % 2 else 300), None) for k in range(q + 1)}
            self.latency_ps, self.events = 1000 * (q + 1), 10 * q
    assert steady.fast_forward(Run, 200) is None


def test_fidelity_in_force_and_bad_names():
    with use_fidelity("exact"):
        r = collective("all_gather", fidelity=None, **CASE)
    assert r.result.obtained.fidelity == "exact" and r.result.obtained.method == "simulated"
    with pytest.raises(CollectiveError, match="unknown fidelity 'fast'"):
        collective("all_gather", fidelity="fast", **CASE)
    with pytest.raises(ValueError, match="unknown fidelity"):
        use_fidelity("none")


def test_groups_side_by_side_alike_are_fast_forwarded_together_unlike_are_not():
    from kbtorch.ops.collective import concurrent_run
    ag = dict(kind="all_gather", nbytes=2 * 2**20, algo="ring", packet_bytes=1024)
    alike = [dict(ag, group=f"cube:{c}") for c in (0, 1)]
    got = {f: concurrent_run(alike, machine="ahbm", mode="fast", fidelity=f)[0] for f in FIDELITIES}
    assert got["auto"].obtained.method == "fast-forward"
    assert got["auto"].latency_ps == got["exact"].latency_ps and got["auto"].pe_finish_ps == got["exact"].pe_finish_ps
    unlike = [alike[0], dict(ag, group="cube:1", op="max")]     # the same rounds, another collective
    assert concurrent_run(unlike, machine="ahbm", mode="fast")[0].obtained.method == "simulated"


def test_caches_of_simulated_runs_are_keyed_by_fidelity():
    """A run cached under one fidelity is never the answer under another: the decorator, and
    the tensor layer's cached collectives (a redistribution) through it."""
    calls = []

    @steady.by_fidelity(8)
    def timed(x):
        calls.append((steady.current_fidelity(), x))
        return x

    for fid in ("auto", "exact", "auto", "exact"):
        with use_fidelity(fid):
            assert timed(3) == 3
    assert calls == [("auto", 3), ("exact", 3)] and timed.cache_info().currsize == 2
    timed.cache_clear()
    assert timed.cache_info().currsize == 0
    from kbtorch.tensor.redistribute import _timed
    machine = load_machine("ahbm")
    lines = (tuple(range(8)),)
    got = {}
    for fid in ("auto", "exact"):
        with use_fidelity(fid):
            got[fid] = _timed(machine, "all_gather", lines, 8 * 8192, "bf16")[2]
    assert {f: r.obtained.fidelity for f, r in got.items()} == {"auto": "auto", "exact": "exact"}


def test_a_chain_resized_adds_up_to_its_latency_shared_by_its_pairs():
    from kbtorch.kernel.steady import resized
    from kbtorch.sim import blame
    chain = blame.extend(blame.extend(blame.extend(None, "hbm0", "service", 600), "l0", "link", 300), "hbm0", "queue", 100)
    for latency in (1000, 1101, 1000 - 97, 1):
        got = resized(chain, latency)
        assert blame.total(got) == latency
        per = {}
        for e, c, ps in blame.segments(got):
            per[(e, c)] = per.get((e, c), 0) + ps
        if latency >= 3:
            assert abs(per[("hbm0", "service")] / latency - 0.6) <= 1 / latency + 1e-9
