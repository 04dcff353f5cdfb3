"""Busy time per resource of a program, added up without simulating it."""
from kbtorch.ops.collective import analytic
from kbtorch.sim.commands import Compute, Dma, Fetch, Loc, Send
from kbtorch.sim.resources import resource_ps


def test_dma_loads_its_links_memories_and_issue(ahbm):
    pes = ahbm.pes
    busy = resource_ps(ahbm, {0: [Dma(Loc(pes[0].hbm), Loc(pes[1].hbm), 1000)]})
    assert busy["cp PE 0"] == ahbm.issue.cmd_ps(32)
    path = ahbm.route(pes[0].hbm, pes[1].hbm)
    for u, v in zip(path, path[1:]):
        assert busy[(u, v)] == 4 * ahbm.graph.edges[u, v]["flit_ps"]      # 1000 B = 4 flits
    assert busy[pes[0].hbm] > 0 and busy[pes[1].hbm] > 0


def test_compute_send_and_fetch(ahbm):
    pes = ahbm.pes
    busy = resource_ps(ahbm, {2: [Compute(8000, engine="gemm"), Send(3, "s", nbytes=10), Fetch(512)]})
    assert busy[pes[2].node("gemm")] == 1000                               # 8000 flop at 8 TFLOP/s
    assert busy["cp PE 2"] == ahbm.issue.cmd_ps(32) + ahbm.issue.cmd_ps(16) + ahbm.issue.cmd_ps(32)
    route = ahbm.route(pes[2].node("ipcq"), pes[3].node("ipcq"))
    assert busy[(route[0], route[1])] == ahbm.graph.edges[route[0], route[1]]["flit_ps"]


def test_the_collective_models_report_the_same_function():
    assert analytic.resource_ps is resource_ps
