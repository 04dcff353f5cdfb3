"""The ``qwen_layer`` sweep workload: one Qwen2 decoder layer, prefill or decode, timing only,
on the "ahbm" device under ``kbtorch.use(machine)``, as ``examples/qwen_layer.py`` runs it.

Its row: the layer's latency, the bottleneck holding most of it, and ``ns_<kind>``: the ops'
latency summed by their bottleneck kind (the device profiles ops, not components). A point
can take tens of seconds (7B prefill); keep it out of tests.
"""
from __future__ import annotations

from collections import Counter

import torch

import kbtorch

from .qwen2 import CONFIGS, KVCache, rotary, tensor_parallel
from .qwen2_run import build_layer, replicate


def layer(machine, mode: str = "decode", kv_len: int = 4096, seq: int = 128, config: str = "7b", batch: int = 1,
          mapping: str | None = None) -> dict:
    """Run the layer (``mode`` decode: one token against ``kv_len`` cached positions; prefill:
    ``seq`` tokens) -> ``{latency_ns, bottleneck, ops, ns_<kind>}``."""
    if mode not in ("decode", "prefill"):
        raise ValueError(f"qwen_layer: mode must be decode or prefill, got {mode!r}")
    cfg, dtype = CONFIGS[config], torch.bfloat16
    s, past = (1, kv_len) if mode == "decode" else (seq, 0)
    with kbtorch.use(machine), kbtorch.timing_only(), torch.inference_mode():
        lay, _ = build_layer(cfg, dtype, True, False)
        lay.to("ahbm")
        (tensor_parallel if (mapping or ("tp" if mode == "decode" else "grid")) == "tp" else replicate)(lay)
        k, v = (torch.empty(batch, cfg.kv_heads, past + s, cfg.head_dim, dtype=dtype, device="ahbm") for _ in range(2))
        x = torch.empty(batch, s, cfg.hidden, dtype=dtype, device="ahbm")
        cos, sin = rotary(torch.arange(past, past + s), cfg.head_dim, cfg.rope_theta)
        with kbtorch.profile() as prof:
            lay(x, cos.to(dtype).to("ahbm"), sin.to(dtype).to("ahbm"), KVCache(k, v, past))
    by_kind = Counter()
    for r in prof.records:
        by_kind[r.bottleneck or "other"] += r.latency_ns
    return {"latency_ns": prof.total_ns, "bottleneck": max(by_kind, key=lambda k: (by_kind[k], k)) if by_kind else "",
            "ops": len(prof.records), **{f"ns_{k}": ns for k, ns in sorted(by_kind.items())}}
