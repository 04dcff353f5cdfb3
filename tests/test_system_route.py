"""Multi-path on a system of chips (``SystemRouter.spray``): on tests/data/tiny_system.toml a
message between chips is sprayed over the chips' port groups (the tray link, the switch
tiers; through one relay chip with ``relays = 1``); bytes conserved and spread over the ways,
numerics the same as single-path, deterministic, bad settings refused by name."""
from pathlib import Path

import pytest
import torch

from kbtorch.ops.collective import collective, torch_reference
from kbtorch.sim.simulator import Simulator
from kbtorch.topology import TopologyError, load_machine

SYSTEM = str(Path(__file__).resolve().parent / "data" / "tiny_system.toml")


def tiny(policy: str = "single", **routing):
    return load_machine(SYSTEM, overrides={"routing.policy": policy, **{f"routing.{k}": v for k, v in routing.items()}})


def ends(m, a: int, b: int):
    """DMA ports of PE 0 of chip ``a`` and of chip ``b`` (4 PEs a chip; chips tray-major)."""
    return m.pes[4 * a].node("dma_wr"), m.pes[4 * b].node("dma_rd")


def crossings(path: tuple) -> list:
    """The system nodes (ports and switches) of a path, in order."""
    return [n for n in path if n.split(".")[-1] in ("peer", "up") or n.startswith("t")
            and not n.startswith("tray")]


def test_port_spray_takes_the_tray_link_and_the_switch():
    m = tiny("port-spray")
    paths = m.paths(*ends(m, 0, 1))
    assert [crossings(p) for p, _ in paths] == [
        ["tray0.chip0.peer", "tray0.chip1.peer"], ["tray0.chip0.up", "t0_0", "tray0.chip1.up"]]
    assert [w for _, w in paths] == [128, 128]          # 2 lanes of 64 GB/s each way
    for p, _ in paths:
        assert p[0] == ends(m, 0, 1)[0] and p[-1] == ends(m, 0, 1)[1]
        assert len(set(p)) == len(p) and all(m.graph.has_edge(u, v) for u, v in zip(p, p[1:]))
    # across trays: only the switch tiers, unless a way may cross one other chip
    assert [crossings(p) for p, _ in m.paths(*ends(m, 0, 2))] == [
        ["tray0.chip0.up", "t0_0", "t1_0", "t0_1", "tray1.chip0.up"]]
    relayed = tiny("port-spray", relays=1).paths(*ends(m, 0, 2))
    assert len(relayed) == 3 and {crossings(p)[0] for p, _ in relayed} == {"tray0.chip0.up", "tray0.chip0.peer"}
    # minimal-spray: the least-latency way only; single: the route; inside a chip: the route
    assert [crossings(p) for p, _ in tiny("minimal-spray").paths(*ends(m, 0, 1))] == [
        ["tray0.chip0.peer", "tray0.chip1.peer"]]
    assert len(tiny().paths(*ends(m, 0, 1))) == 1
    assert len(m.paths(m.pes[0].node("dma_wr"), m.pes[1].node("dma_rd"))) == 1


@pytest.mark.parametrize("mode", ["fast", "coarse"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_bytes_are_conserved_and_spread_over_the_ways(mode, adaptive):
    m = tiny("port-spray", adaptive=adaptive)
    nbytes = 4 << 20
    sim = Simulator(m, mode)
    sim.run_messages([(*ends(m, 0, 1), nbytes)])
    flits = {link.key: link.flits for link in sim.network.links()}
    off = [flits.get(("tray0.chip0.peer", "tray0.chip1.peer"), 0), flits.get(("tray0.chip0.up", "t0_0"), 0)]
    assert sum(off) == nbytes // 256 and min(off) > 0.3 * sum(off)
    assert flits[("tray0.chip1.nic", "tray0.chip1.cube0.r")] == nbytes // 256   # every flit lands once


def test_spraying_beats_one_path_between_chips():
    one = Simulator(tiny(), "fast").run_messages([(*ends(tiny(), 0, 1), 4 << 20)]).latency_ps
    two = Simulator(tiny("port-spray"), "fast").run_messages([(*ends(tiny(), 0, 1), 4 << 20)]).latency_ps
    assert two < 0.6 * one


@pytest.mark.parametrize("kind,algo", [("all_gather", "direct"), ("all_gather", "hier"), ("all_reduce", "hier")])
def test_single_path_and_sprayed_numerics_are_the_same(kind, algo):
    torch.manual_seed(3)
    shards = [torch.randn(1024, dtype=torch.float32) for _ in range(4)]
    want = torch_reference(kind, shards)
    runs = [collective(kind, [s.clone() for s in shards], group="across:chip", algo=algo, machine=m)
            for m in (tiny(), tiny("port-spray"), tiny("port-spray", adaptive=True, relays=1))]
    for r in runs:
        for got, ref in zip(r.outputs, want):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(runs[0].outputs, runs[1].outputs))


@pytest.mark.parametrize("mode", ["fast", "coarse"])
def test_port_spray_beats_single_path_for_a_large_all_gather(mode):
    # one tray: two chips joined by the tray link and the switch, 128 GB/s each
    got = {}
    for name, routing in (("single", {}), ("spray", {"routing.policy": "port-spray", "routing.adaptive": True})):
        m = load_machine(SYSTEM, overrides={"system.trays": 1, **routing})
        got[name] = collective("all_gather", group="across:chip:2", algo="direct", machine=m, nbytes=4 << 20,
                               dtype="bf16", mode=mode).latency_ns
    assert got["spray"] < 0.6 * got["single"]


def test_adaptive_sprayed_runs_are_deterministic():
    m = tiny("port-spray", adaptive=True)
    traces = []
    for _ in range(2):
        sim = Simulator(m, "fast", trace=True)
        sim.run_messages([(*ends(m, a, b), 1 << 20) for a, b in ((0, 1), (1, 0), (2, 0), (3, 2))])
        traces.append(sim.engine.trace_lines())
    assert traces[0] == traces[1]


@pytest.mark.parametrize("routing,entry,match", [
    ({"relays": 2}, "routing.relays", "at most one other chip"),
    ({"policy": "single", "adaptive": True}, "routing.adaptive", "needs a spraying policy"),
])
def test_bad_spray_settings_are_refused_by_name(routing, entry, match):
    policy = routing.pop("policy", "port-spray")
    with pytest.raises(TopologyError, match=match) as err:
        tiny(policy, **routing)
    assert err.value.entry == entry
