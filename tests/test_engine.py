"""The event engine: time order, deterministic ties, correlation IDs; attribution chains."""
import pytest

from kbtorch.sim import blame
from kbtorch.sim.commands import Compute, Dma, Loc
from kbtorch.sim.engine import EDGE, NODE, Engine
from kbtorch.sim.simulator import Simulator
from kbtorch.sim.traffic import PATTERNS, pattern_messages, pattern_pairs


def test_events_fire_by_time_then_priority_then_insertion():
    eng, fired = Engine(), []
    eng.at(5, fired.append, "edge-5", priority=EDGE)
    eng.at(5, fired.append, "node-5a")
    eng.at(3, fired.append, "node-3")
    eng.at(5, fired.append, "node-5b", priority=NODE)
    eng.run()
    assert fired == ["node-3", "node-5a", "node-5b", "edge-5"]
    assert eng.now == 5 and eng.events == 4


def test_events_scheduled_while_running_queue_behind_equal_ones():
    eng, fired = Engine(), []

    def first():
        fired.append("first")
        eng.at(eng.now, fired.append, "edge-later", priority=EDGE)
        eng.at(eng.now, fired.append, "node-later")

    eng.at(7, first)
    eng.at(7, fired.append, "node-queued")
    eng.at(7, fired.append, "edge-queued", priority=EDGE)
    eng.run()
    assert fired == ["first", "node-queued", "node-later", "edge-queued", "edge-later"]
    assert eng.events == 5


def test_scheduling_in_the_past_is_an_error():
    eng = Engine()
    eng.at(10, lambda: eng.at(5, print))
    with pytest.raises(RuntimeError, match=r"in the past \(5 < 10 ps\)"):
        eng.run()


@pytest.mark.parametrize("mode", ["flit", "fast", "coarse"])
def test_every_event_of_a_run_is_scheduled_by_engine_at(ahbm, mode, monkeypatch):
    """One way to schedule: trains, memories and PEs all go through ``Engine.at``."""
    calls = []
    at = Engine.at
    monkeypatch.setattr(Engine, "at", lambda eng, *a, **kw: (calls.append(a[0]), at(eng, *a, **kw)))
    pes = ahbm.pes
    result = Simulator(ahbm, mode=mode).run({0: [Dma(Loc(pes[0].hbm), Loc(pes[17].hbm), 300_000),
                                                 Compute(8000, engine="math")]})
    assert result.events == len(calls) > 2
    calls.clear()
    result = Simulator(ahbm, mode=mode).run_messages(pattern_messages(ahbm, "uniform", 8, 5000, seed=3))
    assert result.events == len(calls) >= 8


def test_correlation_ids_are_unique_and_trace_records_them():
    eng = Engine(trace=True)
    a, b = eng.new_corr(), eng.new_corr()
    eng.record(a, ("x", "y"), "hop", 0, 10, "d")
    assert a != b and eng.trace_lines() == ["0\t10\t1\tx->y\thop\td"]


def test_chains_add_up_and_name_their_elements():
    chain = blame.extend(blame.extend(None, "cpu0", "issue", 40), ("a", "b"), "link", 7)
    assert blame.total(chain) == 47
    assert blame.segments(chain) == [("cpu0", "issue", 40), (("a", "b"), "link", 7)]
    assert blame.extend(chain, "x", "fixed", 0) is chain
    with pytest.raises(ValueError):
        blame.extend(chain, "x", "fixed", -1)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_traffic_patterns_are_deterministic_and_valid(pattern):
    pairs = pattern_pairs(pattern, 256, 300, seed=5)
    assert pairs == pattern_pairs(pattern, 256, 300, seed=5)
    assert all(s != d and 0 <= s < 256 and 0 <= d < 256 for s, d in pairs)


def test_transpose_swaps_index_halves():
    assert pattern_pairs("transpose", 256, 3, seed=0)[1] == (1, 16)


def test_unknown_pattern_is_named():
    with pytest.raises(ValueError, match="unknown traffic pattern 'ring'"):
        pattern_pairs("ring", 256, 1, seed=0)
