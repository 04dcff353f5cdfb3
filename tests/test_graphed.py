"""kbtorch.graphed (kbtorch/tensor/graph/static_calls.py): timing-only static calls replayed without host
work; calls whose state changes, or that read values back to the host, captured every time."""
import pytest
import torch

import kbtorch
from kbtorch.tensor.graph import capture as graph_mod


class _Cache:
    """A KV cache written in place (as ``StaticCache``) or grown by a new tensor (as ``DynamicCache``)."""

    def __init__(self, grow: bool):
        self.grow, self.keys = grow, torch.empty(4, 16, 32).to("ahbm")

    def update(self, k, at):
        if self.grow:
            self.keys = torch.cat([self.keys, k], 1)
        else:
            self.keys.index_copy_(1, at, k)
        return self.keys


class _Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(32, 32)

    def forward(self, x, cache, at):
        k = self.proj(x)
        att = torch.softmax(k @ cache.update(k, at).transpose(1, 2), -1)
        return {"out": att @ cache.keys, "cache": cache}


@pytest.mark.parametrize("grow", [False, True])
def test_timing_only_static_calls_replay_without_host_work(small, monkeypatch, grow):
    """Timing-only, a call that leaves its state as it found it (a cache written in place) is
    replayed by the next like call: nothing captured, the same latency on the stream, fresh
    outputs of the same shapes and placements; a cache that grows is captured every call, and
    so is a call after the weights changed."""
    captures = []
    enter = graph_mod.Graph.__enter__
    monkeypatch.setattr(graph_mod.Graph, "__enter__", lambda g: captures.append(g) or enter(g))
    with kbtorch.timing_only():
        step = _Step().to("ahbm")
        cache = _Cache(grow)
        kbtorch.graphed(step)
        runs, outs = [], []
        for i in range(3):
            x, at = torch.empty(4, 1, 32, device="ahbm"), torch.arange(i, i + 1, device="ahbm")
            with kbtorch.profile() as prof:
                got = step(x, cache, at)
            runs.append((prof.records[0].latency_ns, tuple(got["out"].shape), got["out"].placements))
            assert got["cache"] is cache and got["out"]._value.is_meta and all(got["out"] is not o for o in outs)
            outs.append(got["out"])
        assert len(captures) == (3 if grow else 1) and step.forward.graphs["replayed"] == (0 if grow else 2)
        if not grow:
            assert runs[0] == runs[1] == runs[2]
            step.proj.weight = torch.nn.Parameter(torch.empty(32, 32, device="ahbm"), requires_grad=False)
            step(torch.empty(4, 1, 32, device="ahbm"), cache, torch.arange(3, 4, device="ahbm"))
            assert len(captures) == 2


def test_a_call_reading_values_to_the_host_is_captured_every_time(small):
    def fn(x, n):
        return x * int(n.sum())
    with kbtorch.timing_only():
        g = kbtorch.graphed(fn)
        for _ in range(2):
            g(torch.empty(4, 8, device="ahbm"), torch.ones(2, dtype=torch.long).to("ahbm"))
    assert g.graphs["replayed"] == 0 and g.graphs["calls"] == 2
