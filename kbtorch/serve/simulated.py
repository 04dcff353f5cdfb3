"""The ``simulated`` step model: step latency from kbtorch's own simulation of the model on a machine.

The cheapest public path that times one forward of a batch: a Hugging Face causal LM built
from its config on the meta device (``kbtorch.models.hf.build``, timing-only, RMSNorm fused),
placed by ``kbtorch.models.hf.place_plan`` (tensor parallel over the machine's chips and PEs),
run once per shape under ``kbtorch.profile()`` with a ``DynamicCache`` already holding the
context. A shape is a *uniform* batch: ``rows`` requests, each computing ``new_tokens`` against
``context_tokens`` cached positions (a decode batch is ``(rows, 1, context)``; a prefill chunk
``(1, chunk, context)``).

Simulated shapes are memoized by (the machine's content digest, model, plan, shape), shapes
bucketed to a quarter octave. A batch the memo holds (every request the same bucketed shape)
is answered from it; with ``direct_decodes`` (default) a decode-only batch is simulated as
the uniform shape (its requests, 1 token, their mean context; bucketed, memoized); any other
batch by a least-squares fit over the simulated points, on
features summed over the batch's requests: 1, tokens T (with hinges max(0, T - k) at the
quartiles of the training tokens: piecewise linear), attention work sum(new * context) and
sum(new^2), KV positions read sum(context + new), and requests. ``error()`` reports the fit against direct simulation
on held-out shapes (median and p95 of |fit / simulated - 1|).

NOTE: the past is a ``DynamicCache`` (Hugging Face's default: each layer concatenates its
cache), not a paged kernel: its copies are part of the simulated step, as they are of
``hf_generate``'s decode steps. A mixed batch (prefill chunks beside decodes) is not simulated
directly: the fit adds its requests' attention terms to the tokens' term.
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import torch

import kbtorch

from ..models.hf import build, fuse_norms, kv_cache, place_plan

#: Training shapes (rows, new tokens, context tokens): decode batches and prefill chunks.
GRID = tuple([(b, 1, c) for b in (1, 4, 16, 64) for c in (128, 1024, 4096)]
             + [(1, s, c) for s in (16, 128, 512, 2048) for c in (0, 1024)] + [(4, 128, 0), (16, 32, 512)])
#: Held-out shapes, between the training ones.
HELD_OUT = ((2, 1, 512), (8, 1, 2048), (32, 1, 256), (1, 64, 0), (1, 256, 512), (1, 1024, 256), (8, 64, 128))
_MEMO: dict = {}


def bucket(n: int) -> int:
    """``n`` rounded up to a quarter octave (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ...)."""
    if n <= 8:
        return n
    step = 2 ** (math.floor(math.log2(n)) - 2)
    return -(-n // step) * step


def features(batch: list) -> list:
    """The fit's features of a batch of (new tokens, context tokens), without the hinges."""
    return [1.0, float(sum(n for n, _ in batch)), float(sum(n * c for n, c in batch)),
            float(sum(n * n for n, _ in batch)), float(sum(c + n for n, c in batch)), float(len(batch))]


class SimulatedStep:
    """Step times of ``model`` (a ``kbtorch.models.hf`` preset or config) on ``topology``."""

    def __init__(self, model: str = "qwen2.5-7b", topology: str | None = None, tp: int | None = None, dp: int = 1,
                 grid: tuple = GRID, held_out: tuple = HELD_OUT, direct_decodes: bool = True):
        self.model_name, self.topology, self.tp, self.dp = model, topology, tp, dp
        self.direct_decodes = direct_decodes
        with self._machine():
            self.machine = kbtorch.current_machine()
            self.model, _ = build(model, torch.bfloat16, timing_only=True)
            fuse_norms(self.model)
            with kbtorch.timing_only():
                self.plan, self.where = place_plan(self.model, tp, dp)
        self._key = (self.machine.digest, model, self.plan)
        self.simulated = 0
        self._fit(grid)
        self._error = self._held_out(held_out)

    def _machine(self):
        return kbtorch.use(self.topology) if self.topology else nullcontext()

    def shape_ns(self, rows: int, new: int, context: int) -> float:
        """Simulated ns of one forward of the uniform shape (bucketed), from the memo or simulated now."""
        key = (*self._key, bucket(rows), bucket(new), bucket(context) if context else 0)
        if key not in _MEMO:
            _MEMO[key] = self._forward_ns(*key[-3:])
            self.simulated += 1
        return _MEMO[key]

    def _forward_ns(self, rows: int, new: int, past: int) -> float:
        from transformers import DynamicCache
        entries = kv_cache(self.model.config, rows, past, 2)
        with self._machine(), kbtorch.timing_only(), torch.no_grad(), (
                kbtorch.home(self.where) if self.where else nullcontext()):
            cache = DynamicCache(config=self.model.config)
            for i in range(len(entries) // 2 if past else 0):
                k, v = (torch.empty(entries[2 * i + j][1], dtype=torch.bfloat16, device="ahbm") for j in (0, 1))
                cache.update(k, v, i)
            ids = torch.zeros(rows, new, dtype=torch.long, device="ahbm")
            pos = torch.arange(past, past + new, device="ahbm")[None].expand(rows, new)
            with kbtorch.profile() as prof:
                self.model(input_ids=ids, cache=cache, position_ids=pos, use_cache=True)
        return float(prof.total_ns)

    def _design(self, batches: list) -> np.ndarray:
        rows = []
        for batch in batches:
            f = features(batch)
            rows.append(f + [max(0.0, f[1] - k) for k in self._knots])
        return np.asarray(rows)

    def _fit(self, grid: tuple) -> None:
        tokens = sorted({r * n for r, n, _ in grid})
        self._knots = tuple(sorted({tokens[len(tokens) * q // 4] for q in (1, 2, 3)})) if len(tokens) > 4 else ()
        ys = np.asarray([self.shape_ns(*s) for s in grid])
        x = self._design([[(bucket(n), bucket(c) if c else 0)] * bucket(r) for r, n, c in grid])
        # NOTE: relative least squares (rows scaled by 1 / y): small decode steps count as much as big prefills.
        self._coef = np.linalg.lstsq(x / ys[:, None], np.ones(len(ys)), rcond=None)[0]

    def fit_ns(self, batch: list) -> float:
        """The fit's ns for a batch of (new tokens, context tokens)."""
        return max(0.0, float(self._design([batch])[0] @ self._coef))

    def _held_out(self, shapes: tuple) -> dict:
        errs = [abs(self.fit_ns([(bucket(n), bucket(c) if c else 0)] * bucket(r)) / self.shape_ns(r, n, c) - 1)
                for r, n, c in shapes]
        return {"held_out_shapes": len(errs), "median_rel_error": float(np.median(errs)) if errs else None,
                "p95_rel_error": float(np.percentile(errs, 95)) if errs else None,
                "max_rel_error": max(errs, default=None)}

    def step_ns_of(self, batch) -> float:
        if self.direct_decodes and all(e.new_tokens == 1 for e in batch):
            context = round(sum(e.context_tokens for e in batch) / len(batch))
            return self.shape_ns(len(batch), 1, context)
        shapes = {(bucket(e.new_tokens), bucket(e.context_tokens) if e.context_tokens else 0) for e in batch}
        if len(shapes) == 1:
            new, ctx = next(iter(shapes))
            key = (*self._key, bucket(len(batch)), new, ctx)
            if key in _MEMO:
                return _MEMO[key]
        return self.fit_ns([(e.new_tokens, e.context_tokens) for e in batch])

    def error(self) -> dict:
        return dict(self._error)

    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one position, over all layers (bf16)."""
        return sum(b for _, _, b in kv_cache(self.model.config, 1, 1, 2))

    def hbm_bytes(self) -> int:
        """Modelled HBM of one replica: the machine's over its ``dp`` replicas."""
        return int(self.machine.summary()["hbm_gib_total"] * 2 ** 30) // self.dp

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def describe(self) -> dict:
        return {"kind": "simulated", "model": self.model_name, "machine": self.machine.name,
                "machine_digest": self.machine.digest, "plan": self.plan, "simulated_shapes": self.simulated, "direct_decodes": self.direct_decodes,
                "fit_features": ["1", "tokens", "sum new*ctx", "sum new^2", "sum ctx+new", "requests",
                                 *(f"max(0, tokens-{k})" for k in self._knots)]}
