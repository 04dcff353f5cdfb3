"""Latency never falls when the batch grows (issue 45): the tiny Llama's forward, prompt 6, on
AHBM, eager and as one graph."""
import pytest
import torch

import kbtorch

pytest.importorskip("transformers")

BATCHES = (1, 2, 4)


def _latencies(graph: bool) -> list:
    from kbtorch.models.hf import build
    model, _ = build("tiny-llama")
    model = model.to("ahbm")
    out = []
    for b in BATCHES:
        x = torch.randint(0, 100, (b, 6)).to("ahbm")
        with torch.no_grad(), kbtorch.profile() as prof:
            if graph:
                with kbtorch.graph():
                    model(x)
            else:
                model(x)
        out.append(sum(r.latency_ns for r in prof.records))
    return out


def test_eager_latency_never_falls_when_the_batch_grows():
    got = _latencies(graph=False)
    assert got == sorted(got), dict(zip(BATCHES, got))


def test_graph_latency_never_falls_when_the_batch_grows():
    got = _latencies(graph=True)
    assert got == sorted(got), dict(zip(BATCHES, got))
