"""The one contract of a parallelism plan, and ``parallelize_module``, which applies plans.

A plan is a ``ParallelStyle``: ``apply(module, mesh) -> module`` places ``module``'s tensors
on ``mesh`` (a ``Mesh`` or a sub-mesh, ``mesh["pe"]``) and changes how it runs, if it must,
by the module's own means (forward hooks, a replaced ``forward``); it says what it did in the
model's ``parallel_plan`` (``describe``). Tensor parallelism (``tensor_parallel``: one style
per layer kind), pipeline parallelism (``pipeline_parallel.PipelineParallel``) and expert
parallelism (``expert_parallel.ExpertParallel``) all implement it, and ``parallelize_module``
applies any of them, to the module or, by name pattern, to its submodules. A fourth plan is
one file here: a ``ParallelStyle`` subclass (``docs/extending.md``).

NOTE: the plans differ in what they change, not in how they are applied: tensor parallelism
places parameters only (an op's operands then move as sharding propagation decides); the
pipeline also times each stage's layers on its own clock (``stream.set_clock_ns`` in a
forward pre-hook); expert parallelism replaces each experts module's ``forward``.
"""
from __future__ import annotations

import fnmatch

import torch
from torch import nn


class ParallelStyle:
    """A parallelism plan (module docstring). Subclasses implement ``apply``."""

    def apply(self, module: nn.Module, mesh) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__}.apply(module, mesh)")


def describe(model: nn.Module, key: str, text: str) -> None:
    """Record in ``model.parallel_plan`` (plan key -> one line) what a plan did to it."""
    model.parallel_plan = getattr(model, "parallel_plan", {}) | {key: text}


def _matches(name: str, pattern: str) -> bool:
    parts, pats = name.split("."), pattern.split(".")
    return len(parts) == len(pats) and all(fnmatch.fnmatchcase(a, p) for a, p in zip(parts, pats))


def parallelize_module(module: nn.Module, mesh, plan) -> nn.Module:
    """Apply ``plan`` (a style, or ``{name pattern: style}``, ``*`` matching one name segment
    as in torch: ``"model.layers.*.self_attn.q_proj"``) to ``module`` on ``mesh``. A pattern
    that names no submodule, or a style without ``apply``, is a ValueError naming it, before
    anything moves."""
    plan = {"": plan} if hasattr(plan, "apply") else dict(plan)
    named = dict(module.named_modules())
    found = {}
    for pattern, style in plan.items():
        if not callable(getattr(style, "apply", None)):
            raise ValueError(f"parallelize_module: the style for {pattern!r} ({style!r}) has no apply(module, mesh)")
        hits = [n for n in named if n == pattern or pattern and _matches(n, pattern)]
        if not hits:
            raise ValueError(f"parallelize_module: {pattern!r} names no submodule of {type(module).__name__}")
        found[pattern] = hits
    with torch.no_grad():
        for pattern, style in plan.items():
            for name in found[pattern]:
                out = style.apply(named[name], mesh)
                if out is not None and out is not named[name] and name:
                    module.set_submodule(name, out)
    return module
