"""HBM pseudo-channels: uniform addresses spread over channels, a hot channel serialises."""
import random
from types import SimpleNamespace

import pytest

from kbtorch.sim.commands import Dma, Loc
from kbtorch.sim.components import memory as memory_mod
from kbtorch.sim.components.memory import Memory
from kbtorch.sim.simulator import Simulator

PARAMS = {"channels": 8, "channel_gbps": 32, "burst_bytes": 256}


def test_uniform_read_spreads_over_channels():
    mem = Memory("m", PARAMS, 256)
    head, tail, _ = mem.read(0, None, 0, 256, 0, 64)
    assert (head, tail) == (8000, 64_000)   # 8 bursts per channel, 8 ns each


def test_hot_channel_read_serialises():
    mem = Memory("m", PARAMS, 256)
    head, tail, _ = mem.read(0, None, 0, 256 * 8, 0, 64)
    assert (head, tail) == (8000, 512_000)


def test_requests_queue_per_channel():
    mem = Memory("m", PARAMS, 256)
    mem.read(0, None, 0, 256, 0, 8)
    _, tail, chain = mem.read(0, None, 0, 256, 0, 8)
    assert tail == 16_000 and chain[1] == "service" and chain[3][1] == "queue"


def _requests(seed: int):
    """Random reads and writes of 1 to 4096 bursts on a 192-channel memory (Maia 200's HBM)."""
    rng, t, out = random.Random(seed), 0, []
    for _ in range(300):
        t += rng.randrange(0, 200_000)
        n, addr, stride = rng.choice((1, 3, 15, 16, 128, 1000, 4096)), 256 * rng.randrange(0, 10_000), 256 * rng.choice((1, 1, 2, 3, 64))
        out.append((rng.random() < 0.5, t, addr, stride, rng.randrange(0, 8), n, rng.randrange(0, 300_000)))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_numpy_channel_classes_give_the_loop_results(monkeypatch, seed):
    params = {"channels": 192, "channel_gbps": 36.458333, "burst_bytes": 256}

    def run():
        mem, got = Memory("m", params, 256), []
        for is_read, t, addr, stride, first, n, span in _requests(seed):
            if is_read:
                got.append(mem.read(t, None, addr, stride, first, n))
            else:
                got.append(mem.write(SimpleNamespace(n=n, head=t, tail=t + span, first=first, chain=None), addr, stride))
        assert all(type(x) is int for r in got for x in r[:-1])
        return got, (mem.bursts, mem.busy_ps, [int(f) for f in mem.free])

    vector = run()
    monkeypatch.setattr(memory_mod, "VECTOR_CLASSES", 10**9)
    assert run() == vector


def stream(machine, pes, stride_bursts):
    cmds = {}
    for i in pes:
        pe = machine.pes[i]
        burst = machine.graph.nodes[pe.hbm]["params"]["burst_bytes"]
        cmds[i] = [Dma(Loc(pe.hbm), Loc(pe.node("tcm")), 1 << 18, src_stride=stride_bursts * burst)]
    result = Simulator(machine).run(cmds)
    start_ns = min(machine.launch_ps(i) for i in pes) / 1000    # NOTE: counted from the first kernel launch
    return len(pes) * (1 << 18) / (result.latency_ns - start_ns)


def test_cube_streams_at_about_1024_gbps_and_hot_channel_at_32_per_pe(ahbm):
    assert 960 < stream(ahbm, range(8), 1) < 1030
    assert 235 < stream(ahbm, [0], 1) < 257
    assert 30 < stream(ahbm, [0], 8) < 32.1
    assert 8 * 30 < stream(ahbm, range(8), 8) < 8 * 32.1
