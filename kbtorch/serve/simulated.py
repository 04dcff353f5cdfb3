"""The ``simulated`` step model: step latency from kbtorch's own simulation of the model on a machine.

The cheapest public path that times one forward of a batch: a Hugging Face causal LM built
from its config on the meta device (``kbtorch.models.hf.build``, timing-only, RMSNorm fused),
placed by ``kbtorch.models.hf.place_plan`` (tensor parallel over the machine's chips and PEs),
run once per shape under ``kbtorch.profile()`` with a ``DynamicCache`` already holding the
context. A shape is a *uniform* batch: ``rows`` requests, each computing ``new_tokens`` against
``context_tokens`` cached positions (a decode batch is ``(rows, 1, context)``; a prefill chunk
``(1, chunk, context)``).

Simulated shapes are memoized by (the machine's content digest, model, plan, shape) and a batch
is read from two tables of them, one per regime, each interpolated linearly between grid
points (a corner is simulated the first time a batch needs it):
- a decode-only batch of ``r`` requests of mean context ``c``: the decode table
  ``(r, 1, c)`` over rows and context;
- any batch with a prefill chunk: the prefill table ``(1, T, c)`` over the batch's tokens
  ``T`` and its chunks' mean context (token-weighted), plus, for the decodes beside the
  chunks, what their context adds to a decode of them (``decode(r, c) - decode(r, 0)``): the
  GEMMs see all ``T`` tokens at once, the decodes' attention and cache reads are their own.

Grid points: rows 1, 2, 4, 8, ...; tokens at half octaves 1, 2, 3, 4, 6, 8, 12, ... (NOTE: a
prefill's time per token is not smooth in its tokens, the GEMMs' tiles filling unevenly:
Qwen2.5-7B on maia200 takes 25.3, 24.1 and 26.7 us per token at 512, 700 and 1024 tokens);
context 0, 128, 256, 512, ... ``error()`` reports the tables against direct simulation of
held-out shapes between grid points (median and p95 of |table / simulated - 1|): by default
(``held_out="run"``) shapes drawn from the batches the tables answered, at evenly spaced
quantiles of them, simulated directly when the error is first asked for (at a run's end).

NOTE: the past is a ``DynamicCache`` (Hugging Face's default: each layer concatenates its
cache), not a paged kernel: its copies are part of the simulated step, as they are of
``hf_generate``'s decode steps. A mixed batch (prefill chunks beside decodes, or decodes of
different contexts) is not simulated directly (one Hugging Face forward has one sequence
length): it is read by the decomposition above, which the held-out error does not cover.
"""
from __future__ import annotations

import hashlib
import math
from contextlib import nullcontext

import numpy as np
import torch

import kbtorch

from ..models.hf import build, fuse_norms, kv_cache, place_plan
from .cache import StepCache
from .kv import BLOCK_TOKENS, capacity_blocks
from .workers import Workers

#: Held-out shapes drawn from the batches the tables answered (``held_out="run"``): this many
#: decodes and as many prefills.
RUN_HELD_OUT = 4
#: The first context grid point above 0.
FIRST_CONTEXT = 128
_MEMO: dict = {}


def corners(x: float, first: int = 1, half: bool = False) -> list:
    """(grid point, weight) of linear interpolation at ``x`` on the points 0 (when ``first`` > 1),
    ``first``, 2 ``first``, 4 ``first``, ... (``half``: also 1.5 times each from 2 ``first``): one
    point when ``x`` is on one, else the two around it."""
    if x <= 0:
        return [(0, 1.0)]
    lo = first * 2 ** math.floor(math.log2(x / first)) if x >= first else 0
    mid = half and lo >= 2 * first
    if mid and x >= 1.5 * lo:
        lo, hi = 1.5 * lo, 2 * lo
    else:
        hi = 1.5 * lo if mid else 2 * lo if lo else first
    if lo == x:
        return [(int(x), 1.0)]
    w = (x - lo) / (hi - lo)
    return [(int(lo), 1.0 - w), (int(hi), w)]


#: What a step's LM head computes: in the step cache's key, so a time of another rule is never read.
HEAD = "lm head: last position of each sequence"


class SimulatedStep:
    """Step times of ``model`` (a ``kbtorch.models.hf`` preset or config) on ``topology``."""

    def __init__(self, model: str = "qwen2.5-7b", topology: str | None = None, tp: int | None = None, dp: int = 1,
                 held_out: tuple | str = "run", cache: str | None = None, workers: int = 1):
        self.model_name, self.topology, self.tp, self.dp = model, topology, tp, dp
        self.cache = StepCache(cache) if cache is not None else None
        with self._machine():
            self.machine = kbtorch.current_machine()
            self.model, _ = build(model, torch.bfloat16, timing_only=True)
            fuse_norms(self.model)
            with kbtorch.timing_only():
                self.plan, self.where = place_plan(self.model, tp, dp)
        # NOTE: the model by its config's content too: a config file edited is another model.
        config = hashlib.sha256(self.model.config.to_json_string(use_diff=False).encode()).hexdigest()[:16]
        self._key = (self.machine.digest, str(model), config, self.plan, HEAD)
        self.simulated, self.cached, self._kv = 0, 0, None
        self._asked: dict = {}      # uniform shapes the tables were read at, between grid points -> batches
        if held_out != "run" and not isinstance(held_out, tuple):
            raise ValueError(f"held_out={held_out!r}: 'run' or a tuple of (rows, new tokens, context) shapes")
        # NOTE: the workers before the held-out shapes given, which they simulate too.
        self._workers = Workers(workers, type(self), (model, self.machine, tp, dp), self._key) if workers != 1 else None
        self._error = None if held_out == "run" else dict(self._held_out(held_out), held_out_from="given")

    def _machine(self):
        return kbtorch.use(self.topology) if self.topology else nullcontext()

    def shape_ns(self, rows: int, new: int, context: int) -> float:
        """Simulated ns of one forward of the uniform shape at the fidelity in force: from the
        memo, the step cache (``cache``: an SQLite file, ``serve.cache``), or simulated now (and
        kept in both)."""
        self._ensure([(rows, new, context)])
        return _MEMO[self._key_of((rows, new, context))]

    def _key_of(self, shape: tuple) -> tuple:
        # NOTE: the fidelity in force too (``kbtorch.use_fidelity``): a time of one is never read under another.
        return (*self._key, kbtorch.current_fidelity(), *shape)

    def _ensure(self, shapes) -> None:
        """Every one of ``shapes`` in the memo: read from the step cache, or simulated now (side
        by side over the ``workers`` when more than one is missing)."""
        missing = []
        for shape in dict.fromkeys(shapes):
            key = self._key_of(shape)
            if key in _MEMO:
                continue
            got = self.cache.get(key) if self.cache is not None else None
            if got is None:
                missing.append(shape)
            else:
                self.cached += 1
                _MEMO[key] = got
        if self._workers is not None and len(missing) > 1:
            times = self._workers.simulate(missing, self.simulate_ns, kbtorch.current_fidelity())
        else:
            times = [self.simulate_ns(shape) for shape in missing]
        for shape, got in zip(missing, times):
            self.simulated += 1
            if self.cache is not None:
                self.cache.put(self._key_of(shape), got)
            _MEMO[self._key_of(shape)] = got

    def simulate_ns(self, shape: tuple) -> float:
        """Simulated ns of one forward of ``shape`` (rows, new tokens, context), now, in this process."""
        return float(self.forward(*shape)[0].total_ns)

    def close(self) -> None:
        """Stop the ``workers`` (a step model closed still answers, in this process alone)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def forward(self, rows: int, new: int, past: int, graph: dict | None = None) -> tuple:
        """(profile, graph) of one forward of the uniform shape (``rows`` requests, ``new``
        tokens each, ``past`` cached positions), simulated now at the fidelity in force: where
        its time goes and how it was obtained (``Profile.obtained``). ``graph``: the options
        of ``kbtorch.graph`` to capture and time the forward as one graph (None: eager, and
        no graph). Not memoized (``shape_ns`` is)."""
        from transformers import DynamicCache
        entries = kv_cache(self.model.config, rows, past, 2)
        with self._machine(), kbtorch.timing_only(), torch.no_grad(), (
                kbtorch.home(self.where) if self.where else nullcontext()):
            cache = DynamicCache(config=self.model.config)
            for i in range(len(entries) // 2 if past else 0):
                mesh, placements = self._kv_placements()[i]
                k, v = (kbtorch.distribute_tensor(torch.empty(entries[2 * i + j][1], dtype=torch.bfloat16,
                                                              device="ahbm"), mesh, placements) for j in (0, 1))
                cache.update(k, v, i)
            ids = torch.zeros(rows, new, dtype=torch.long, device="ahbm")
            pos = torch.arange(past, past + new, device="ahbm")[None].expand(rows, new)
            with kbtorch.profile() as prof, (kbtorch.graph(**graph) if graph is not None else nullcontext()) as g:
                # NOTE: the LM head of each sequence's last position only, as generate() and vLLM
                # compute it (a 1024-token Qwen2.5-7B prefill: 3.2% less than every position's).
                self.model(input_ids=ids, cache=cache, position_ids=pos, use_cache=True, logits_to_keep=1)
        return prof, g

    def _kv_placements(self) -> list:
        """(mesh, placements) of each layer's cached keys as the model itself places them: read
        from a cache its one-token forward filled (NOTE: a past made replicated would be
        gathered again by every layer's concatenation, which no engine does)."""
        if self._kv is None:
            from transformers import DynamicCache
            with self._machine(), kbtorch.timing_only(), torch.no_grad(), (
                    kbtorch.home(self.where) if self.where else nullcontext()):
                cache = DynamicCache(config=self.model.config)
                self.model(input_ids=torch.zeros(1, 1, dtype=torch.long, device="ahbm"), cache=cache, use_cache=True)
                self._kv = [(layer.keys.device_mesh, layer.keys.placements) for layer in cache.layers]
        return self._kv

    def decode_ns(self, rows: float, context: float) -> float:
        """The decode table at ``rows`` requests of one new token each, ``context`` positions each."""
        return self._read(self._decode_terms(rows, context))

    def prefill_ns(self, tokens: float, context: float) -> float:
        """The prefill table at one chunk of ``tokens`` new tokens against ``context`` positions."""
        return self._read(self._prefill_terms(tokens, context))

    def table_ns(self, rows: int, new: int, context: int) -> float:
        """The tables' ns of the uniform shape (what ``step_ns_of`` answers for such a batch)."""
        return self._read(self._table_terms(rows, new, context))

    @staticmethod
    def _decode_terms(rows: float, context: float) -> list:
        return [(wr * wc, (r, 1, c)) for r, wr in corners(rows) for c, wc in corners(context, FIRST_CONTEXT) if wr * wc]

    @staticmethod
    def _prefill_terms(tokens: float, context: float) -> list:
        return [(wt * wc, (1, t, c)) for t, wt in corners(tokens, half=True)
                for c, wc in corners(context, FIRST_CONTEXT) if wt * wc]

    def _table_terms(self, rows: int, new: int, context: int) -> list:
        return self._decode_terms(rows, context) if new == 1 else self._prefill_terms(rows * new, context)

    def _read(self, terms: list) -> float:
        self._ensure([shape for _, shape in terms])
        return self._sum(terms)

    def _sum(self, terms: list) -> float:
        return sum(w * _MEMO[self._key_of(shape)] for w, shape in terms)

    def _held_out(self, shapes: tuple) -> dict:
        self._ensure([*shapes, *(x for r, n, c in shapes for _, x in self._table_terms(r, n, c))])
        errs = [abs(self.table_ns(r, n, c) / self.shape_ns(r, n, c) - 1) for r, n, c in shapes]
        return {"held_out_shapes": len(errs), "shapes": [list(x) for x in shapes],
                "median_rel_error": float(np.median(errs)) if errs else None,
                "p95_rel_error": float(np.percentile(errs, 95)) if errs else None,
                "max_rel_error": max(errs, default=None)}

    def _note(self, rows: int, new: int, context: float) -> None:
        """A batch the tables answered as the uniform shape (``rows``, ``new``, ``context``):
        kept for the held-out error (``error``) when it lies between grid points."""
        tokens = rows * new
        if new != 1 and tokens < 2:
            return          # NOTE: one token is a decode's shape: not a prefill table's point
        size = corners(rows) if new == 1 else corners(tokens, half=True)
        if len(size) > 1 or len(corners(context, FIRST_CONTEXT)) > 1:
            shape = (rows, 1, round(context)) if new == 1 else (1, tokens, round(context))
            self._asked[shape] = self._asked.get(shape, 0) + 1

    def _run_shapes(self) -> tuple:
        """``RUN_HELD_OUT`` decodes and as many prefills among the shapes the tables answered:
        those at evenly spaced quantiles of the batches (so a shape used often is more likely)."""
        out = []
        for decode in (True, False):
            shapes = sorted(x for x in self._asked if (x[1] == 1) == decode)
            total = sum(self._asked[x] for x in shapes)
            seen, picks = 0, []
            for x in shapes:
                lo, seen = seen, seen + self._asked[x]
                picks += [x] * sum(1 for i in range(RUN_HELD_OUT) if lo <= (i + 0.5) * total / RUN_HELD_OUT < seen)
            out += sorted(set(picks))
        return tuple(out)

    def step_ns_of(self, batch) -> float:
        decodes = [e.context_tokens for e in batch if e.new_tokens == 1 and not e.prefill]
        chunks = [e for e in batch if e.new_tokens != 1 or e.prefill]
        mean = sum(decodes) / len(decodes) if decodes else 0.0
        if not chunks:
            self._note(len(decodes), 1, mean)
            return self.decode_ns(len(decodes), mean)
        tokens = sum(e.new_tokens for e in batch)
        context = sum(e.new_tokens * e.context_tokens for e in chunks) / sum(e.new_tokens for e in chunks)
        if not decodes:
            self._note(1, tokens, context)
        prefill = self._prefill_terms(tokens, context)
        busy, idle = (self._decode_terms(len(decodes), mean), self._decode_terms(len(decodes), 0)) if decodes else ([], [])
        self._ensure([x for _, x in prefill + busy + idle])
        return self._sum(prefill) + max(0.0, self._sum(busy) - self._sum(idle))

    def transfer_ns(self, nbytes: int) -> float:
        """Simulated ns of ``nbytes`` of KV cache moving from replica 0's chips to replica 1's
        (``kbtorch.chip_transfer_ns``): the prefill and decode pools of a disaggregated run on
        this machine. Linear between byte counts at octaves, each simulated once."""
        if self.dp < 2:
            raise ValueError(f"disaggregation: the KV moves between two replicas of '{self.machine.name}'; "
                             f"the step model has dp {self.dp} (give dp >= 2: prefill and decode replicas)")
        src, dst = self.pool_chips()
        with self._machine():
            return sum(w * kbtorch.chip_transfer_ns(src, dst, b) for b, w in corners(max(1, nbytes)) if w)

    def pool_chips(self) -> tuple:
        """(replica 0's chips, replica 1's chips): a disaggregated run's prefill and decode pools."""
        tp = self.machine.chips // max(1, self.dp)
        return tuple(range(tp)), tuple(range(tp, 2 * tp))

    def kv_blocks(self, hbm_utilization: float = 0.9, block_tokens: int = BLOCK_TOKENS) -> int:
        """KV blocks of one replica: its HBM x ``hbm_utilization`` (vLLM's ``gpu_memory_utilization``)
        less the weights."""
        hbm = self.hbm_bytes()
        return capacity_blocks(hbm, self.weight_bytes(), round(hbm * (1 - hbm_utilization)), self.kv_bytes_per_token(),
                               block_tokens)

    def kv_link(self) -> "SimulatedLink":
        """The transfer model of a disaggregated run's KV (``transfer_ns``), for ``serve.Disaggregation``."""
        return SimulatedLink(self)

    def error(self) -> dict:
        """The tables against direct simulation of held-out shapes (median, p95 and largest
        ``|table / simulated - 1|``): the shapes given, or (``held_out="run"``) those drawn from
        the batches the tables answered so far, fixed once drawn (``_run_shapes``)."""
        if self._error is None:
            shapes = self._run_shapes()
            if not shapes:
                return self._held_out(())
            self._error = dict(self._held_out(shapes), held_out_from="run")
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
                "machine_digest": self.machine.digest, "plan": self.plan, "simulated_shapes": self.simulated,
                "cached_shapes": self.cached, "step_cache": self.cache.path if self.cache is not None else None,
                "tables": "decode (rows, 1, context), prefill (1, tokens, context): linear between octaves"}


class SimulatedLink:
    """``SimulatedStep.transfer_ns`` as a transfer model of ``serve.Disaggregation``."""

    def __init__(self, step: SimulatedStep):
        self.step = step

    def transfer_ns(self, nbytes: int) -> float:
        return self.step.transfer_ns(nbytes)

    def describe(self) -> dict:
        src, dst = self.step.pool_chips()
        return {"kind": "simulated", "machine": self.step.machine.name, "from_chips": list(src),
                "to_chips": list(dst), "by": "kbtorch.chip_transfer_ns, linear between octaves of bytes"}
