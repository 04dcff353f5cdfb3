"""Links and flit trains: closed form, contention, fast vs flit-exact, determinism, trace."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kbtorch.sim.simulator import Simulator
from kbtorch.sim.traffic import pattern_messages


def closed_form_ps(machine, path, n_flits):
    """sum(node overheads) + sum(prop + flit) + (N - 1) * max flit, in ps."""
    g = machine.graph
    edges = [g.edges[u, v] for u, v in zip(path, path[1:])]
    return (sum(g.nodes[v]["overhead_ps"] for v in path[1:]) + sum(e["prop_ps"] + e["flit_ps"] for e in edges)
            + (n_flits - 1) * max(e["flit_ps"] for e in edges))


def ports(machine, src, dst):
    return machine.pes[src].node("dma_wr"), machine.pes[dst].node("dma_rd")


@pytest.mark.parametrize("src,dst", [(0, 1), (0, 15), (0, 255), (37, 200)])
@pytest.mark.parametrize("nbytes", [1, 256, 1000, 65536])
@pytest.mark.parametrize("mode", ["fast", "flit"])
def test_uncontended_message_meets_closed_form_exactly(ahbm, src, dst, nbytes, mode):
    a, b = ports(ahbm, src, dst)
    result = Simulator(ahbm, mode).run_messages([(a, b, nbytes)])
    assert result.finishes[0] == closed_form_ps(ahbm, ahbm.route(a, b), -(-nbytes // 256))


def test_one_mib_fast_is_exact_with_100x_fewer_events(ahbm):
    a, b = ports(ahbm, 0, 255)
    fast = Simulator(ahbm, "fast").run_messages([(a, b, 1 << 20)])
    flit = Simulator(ahbm, "flit").run_messages([(a, b, 1 << 20)])
    assert fast.latency_ps == flit.latency_ps == closed_form_ps(ahbm, ahbm.route(a, b), 4096)
    assert flit.events >= 100 * fast.events


@pytest.mark.parametrize("nbytes", [256, 65536, 1 << 20])
def test_coarse_message_of_one_train_is_one_event_and_exact_alone(ahbm, nbytes):
    # NOTE: the path is committed when the message is sent; only its completion is an event.
    a, b = ports(ahbm, 0, 255)
    result = Simulator(ahbm, "coarse").run_messages([(a, b, nbytes)])
    assert result.finishes[0] == closed_form_ps(ahbm, ahbm.route(a, b), -(-nbytes // 256))
    assert result.events == 1


def test_coarse_messages_committed_at_send_still_share_a_bottleneck(ahbm):
    first, second = (*ports(ahbm, 0, 8), 1 << 18), (*ports(ahbm, 1, 9), 1 << 18)
    alone = Simulator(ahbm, "coarse").run_messages([first]).finishes[0]
    both = Simulator(ahbm, "coarse").run_messages([first, second])
    assert both.events == 2
    # one 1024-flit train each: the first sent keeps the link, the second fills what is left
    assert min(both.finishes) == alone and 1.9 < max(both.finishes) / alone < 2.1


@pytest.mark.parametrize("mode", ["fast", "flit"])
def test_two_transfers_through_one_bottleneck_each_take_twice_as_long(ahbm, mode):
    # PE 0 -> PE 8 and PE 1 -> PE 9 share every NoC link from CUBE 0's r0 to CUBE 1's r0.
    first, second = (*ports(ahbm, 0, 8), 1 << 18), (*ports(ahbm, 1, 9), 1 << 18)
    alone = Simulator(ahbm, mode).run_messages([first]).finishes[0]
    both = Simulator(ahbm, mode).run_messages([first, second]).finishes
    for t in both:
        assert 1.9 < t / alone < 2.1


def test_half_rate_streams_share_a_faster_link_without_slowing(ahbm):
    # PE 2 (router r1) and PE 6 (r3) both cross CUBE 0's east UCIe link (512 GB/s) at 256 GB/s.
    first, second = (*ports(ahbm, 2, 8), 1 << 18), (*ports(ahbm, 6, 12), 1 << 18)
    shared = set(zip(ahbm.route(*first[:2]), ahbm.route(*first[:2])[1:])) & set(
        zip(ahbm.route(*second[:2]), ahbm.route(*second[:2])[1:]))
    assert [ahbm.graph.edges[e]["kind"] for e in shared] == ["ucie"]
    for mode in ("fast", "flit"):
        alone = Simulator(ahbm, mode).run_messages([first]).finishes[0]
        both = Simulator(ahbm, mode).run_messages([first, second]).finishes
        assert max(both) / alone < 1.01


@pytest.mark.parametrize("pattern", ["uniform", "transpose", "hotspot"])
def test_fast_mode_tracks_flit_exact_under_contention(ahbm, pattern):
    msgs = pattern_messages(ahbm, pattern, 48, 32 << 10, seed=3)
    fast = Simulator(ahbm, "fast").run_messages(msgs)
    flit = Simulator(ahbm, "flit").run_messages(msgs)
    errors = [abs(a - b) / b for a, b in zip(fast.finishes, flit.finishes)]
    assert max(errors) < 0.02
    assert sum(errors) / len(errors) < 0.01
    assert fast.events < flit.events / 3


def test_fast_trains_per_message_stay_bounded_at_every_size(ahbm):
    """A message of 128 to 4096 flits moves as about 32 trains whatever its size (no cliff
    below 512 flits, where a 455-flit block was 114 trains of 4; beyond 4096 the trains
    are 128 flits), and still tracks the flit-exact run under contention (each message as
    the 512-flit ones do: a few % at worst, the last finish within 0.1%)."""
    net = Simulator(ahbm, "fast").network
    counts = [len(net.chunks(n)) for n in range(1, 4097)]
    assert max(counts) <= 40 and len(net.chunks(455)) <= 40
    msgs = pattern_messages(ahbm, "uniform", 48, 455 * 256, seed=3)
    fast = Simulator(ahbm, "fast").run_messages(msgs)
    flit = Simulator(ahbm, "flit").run_messages(msgs)
    errors = [abs(a - b) / b for a, b in zip(fast.finishes, flit.finishes)]
    assert max(errors) < 0.04 and sum(errors) / len(errors) < 0.01
    assert abs(fast.latency_ps / flit.latency_ps - 1) < 1e-3 and fast.events < flit.events / 10


def test_attribution_covers_every_picosecond(ahbm):
    msgs = pattern_messages(ahbm, "hotspot", 16, 8192, seed=1)
    result = Simulator(ahbm).run_messages(msgs)
    breakdown = result.breakdown()
    assert sum(breakdown.values()) == result.latency_ps
    assert {"noc", "router"} <= set(breakdown)
    assert sum(ps for _, _, ps in result.critical_path()) == result.latency_ps


def test_trace_of_a_request_runs_from_injection_to_completion(ahbm):
    a, b = ports(ahbm, 0, 15)
    result = Simulator(ahbm, trace=True).run_messages([(a, b, 4096)])
    records = [line.split("\t") for line in result.trace]
    mine = [r for r in records if r[2] == "1"]
    assert mine[0][4] == "inject" and mine[-1][4] == "done"
    hops = [r[3] for r in mine if r[4] == "hop"]
    path = ahbm.route(a, b)
    assert list(dict.fromkeys(hops)) == [f"{u}->{v}" for u, v in zip(path, path[1:])]
    assert int(mine[-1][0]) == result.latency_ps


SCRIPT = """
from kbtorch.topology import load_machine
from kbtorch.sim.simulator import Simulator
from kbtorch.sim.traffic import pattern_messages
m = load_machine("ahbm")
r = Simulator(m, trace=True).run_messages(pattern_messages(m, "uniform", 24, 20000, seed=7))
print("\\n".join(r.trace))
"""


def test_trace_is_byte_identical_across_runs_and_hash_seeds():
    root = Path(__file__).resolve().parents[1]
    outs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(root))
        outs.append(subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, check=True).stdout)
    assert outs[0] == outs[1]
    assert len(outs[0].splitlines()) > 100


@pytest.mark.parametrize("nbytes", [1000, 64 << 10, 1 << 20])
def test_flit_exact_mode_moves_single_flits(ahbm, nbytes):
    a, b = ports(ahbm, 0, 9)
    result = Simulator(ahbm, "flit").run_messages([(a, b, nbytes)])
    assert result.events == -(-nbytes // 256) * (len(ahbm.route(a, b)) - 1) + 1
