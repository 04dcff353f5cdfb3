"""A Hugging Face causal LM (full size, timing only) decoding on a system of chips under one
parallel plan, as ``examples/hf_generate.py`` runs it with ``--ep`` / ``--pp``: the points of
``benchmarks/bench_plans.py`` and the EP row of ``benchmarks/bench_models.py``.

A function of the sweep workload form (``fn(machine, **params) -> row``): the study
``kbtorch/studies/mixtral_plans.toml`` (Mixtral-8x7B on maia200_x8, the plan swept) and its
tiny counterpart ``tests/data/tiny_plans.toml`` run it.

Plans (``plan``):
- ``tp``: every weight over a flat mesh of all PEs of the system (``place_tp``: column/row
  parallel linears; the default placement, which is tensor parallel over every chip);
- ``tp_pp``: the same, then ``kbtorch.pipeline_parallel`` in ``stages`` chip groups with
  ``microbatches`` per call (tensor parallel inside each stage);
- ``ep``: ``place_tp``, then ``kbtorch.expert_parallel`` over every chip.

Its row: the decode step's latency (``latency_ns``, one token per sequence of the batch
after a prefill of ``prompt`` tokens), the prefill's (``ttft_ns``), decode tokens/s, and the
share of the decode step's op time in all-to-alls, in other collectives and in pipeline
sends; of the experts (``ep``): how many were routed in the step and the HBM bytes its
expert kernels moved (the routed experts' weights, their activations and partial sums: the
simulator's count) as a share of all experts' weight bytes (``pct_expert_hbm_bytes``; near
the routed share for a full-size model, whose weights dominate; above 100% for a tiny one,
whose activations do). A point takes minutes (a full-size model);
keep it out of tests.
"""
from __future__ import annotations

import torch

import kbtorch

from .hf import build, fuse_norms, place_tp

PLANS = ("tp", "tp_pp", "ep")


def apply(model, plan: str, stages: int = 2, microbatches: int = 2):
    """``model`` (on ahbm, placed by ``place_tp``) under ``plan`` (module docstring)."""
    if plan == "tp_pp":
        kbtorch.pipeline_parallel(model, kbtorch.chip_mesh(), stages, microbatches)
    elif plan == "ep":
        kbtorch.expert_parallel(model, kbtorch.chip_mesh())
    elif plan != "tp":
        raise ValueError(f"plan must be one of {', '.join(PLANS)}, got {plan!r}")
    return model


class _Steps:
    """The span of every forward call's ops (simulated ns), from a profile's records."""

    def __init__(self, model, prof):
        self.prof, self.spans, self.first = prof, [], 0
        model.register_forward_pre_hook(self._begin)
        model.register_forward_hook(self._end)

    def _begin(self, module, args):
        self.first = len(self.prof.records)

    def _end(self, module, args, out):
        recs = self.prof.records[self.first:]
        start = min(r.start_ns for r in recs)
        self.spans.append((max(r.start_ns + r.latency_ns for r in recs) - start, recs))


def decode(machine, plan: str = "tp", model: str = "mixtral-8x7b", batch: int = 8, prompt: int = 16,
           stages: int = 2, microbatches: int = 2) -> dict:
    """Prefill ``prompt`` tokens and decode one more for ``batch`` sequences (module docstring)."""
    with kbtorch.use(machine), kbtorch.timing_only(), torch.no_grad():
        net, _ = build(model, torch.bfloat16, timing_only=True)
        fuse_norms(net)
        net.to("ahbm")
        place_tp(net)
        apply(net, plan, stages, microbatches)
        ids = torch.randint(2, net.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1))
        with kbtorch.profile() as prof:
            steps = _Steps(net, prof)
            net.generate(ids.to("ahbm"), max_new_tokens=2, min_new_tokens=2, do_sample=False)
    (ttft, _), (step, recs) = steps.spans[0], steps.spans[1]
    total = sum(r.latency_ns for r in recs) or 1.0

    def share(test) -> float:
        return 100 * sum(r.latency_ns for r in recs if test(r)) / total
    experts = [r for r in recs if r.name == "ep experts"]
    routed = [int(r.detail.split(" of ")[0]) for r in experts]
    weights = sum(p.numel() * p.element_size() for n, p in net.named_parameters() if n.endswith(
        ("experts.gate_up_proj", "experts.down_proj")))
    return {"latency_ns": step, "ttft_ns": ttft, "decode_tokens_per_s": batch * 1e9 / step,
            "pct_all_to_all": share(lambda r: r.kernel.startswith("all_to_all")),
            "pct_other_collectives": share(lambda r: r.name.startswith(("redistribute", "ep reduce"))),
            "pct_pp_sends": share(lambda r: r.name.startswith("pp send")), "ops": len(recs),
            "experts_routed_per_layer": max(routed, default=None),
            "pct_expert_hbm_bytes": 100 * sum(r.bytes for r in experts) / weights if experts else None}
