"""Helpers of ``examples/qwen_layer.py``: building a layer (with data or timing-only), the
LM head's time, and the Hugging Face path. Kept apart from ``qwen2.py``, which is plain
torch with no kbtorch inside.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext

import torch
from torch import nn

import kbtorch

from .qwen2 import DecoderLayer, Qwen2Config, RMSNorm, place, rotary


def build_layer(cfg: Qwen2Config, dtype, timing_only: bool, check: bool):
    """(layer to move to ahbm, CPU copy for the check or None). Timing-only layers are
    built on the meta device: no weights are ever materialised."""
    if timing_only:
        with torch.device("meta"):
            return DecoderLayer(cfg).to(dtype), None
    layer = DecoderLayer(cfg).to(dtype)
    for p in layer.parameters():
        with torch.no_grad():
            p.add_(torch.randn_like(p) * 0.02)          # non-trivial norms' weights and biases
    return layer, copy.deepcopy(layer) if check else None


def replicate(module: nn.Module) -> nn.Module:
    """Place every parameter of ``module`` (on ahbm) replicated on all PEs: each matmul then
    runs as one GEMM over all PEs on its automatic grid (see ``kbtorch/tensor/handlers/matmul.py``)."""
    return place(module, lambda leaf, pname: kbtorch.Replicate())


def lm_head_ns(cfg: Qwen2Config, batch: int, graph: bool = False) -> tuple[float, int]:
    """(simulated ns, HBM bytes) of the final norm and the LM head for one decode token:
    a column-parallel GEMV over the vocabulary (the weight sharded on its rows); ``graph``:
    captured and timed as one graph (``kbtorch.graph``)."""
    with kbtorch.timing_only():
        with torch.device("meta"):
            norm = RMSNorm(cfg.hidden, cfg.rms_eps).to(torch.bfloat16)
            head = nn.Linear(cfg.hidden, cfg.vocab, bias=False).to(torch.bfloat16)
        norm.to("ahbm")
        head.to("ahbm")
        x = torch.empty(batch, 1, cfg.hidden, dtype=torch.bfloat16, device="ahbm")
        with torch.inference_mode(), kbtorch.profile() as prof, kbtorch.graph(name="lm head") if graph else nullcontext():
            head(norm(x))
    return prof.total_ns, cfg.vocab * cfg.hidden * 2


def run_hf(args):
    """An unmodified Hugging Face ``Qwen2DecoderLayer`` (random weights from a
    ``Qwen2Config``, no download) on ahbm against the same layer on CPU: prefill only."""
    try:
        from transformers import Qwen2Config as HFConfig
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
    except ImportError as exc:
        raise SystemExit(f"--hf needs the optional extra 'hf' (transformers): pip install -e \".[hf]\" in a checkout, "
                         f"pip install \"kbtorch[hf]\" for a wheel ({exc})")
    if args.seq is None:
        raise SystemExit("--hf runs prefill: give --seq S")
    from .qwen2 import CONFIGS
    cfg = CONFIGS[args.config]
    hf = HFConfig(hidden_size=cfg.hidden, intermediate_size=cfg.intermediate, num_attention_heads=cfg.heads,
                  num_key_value_heads=cfg.kv_heads, rms_norm_eps=cfg.rms_eps, rope_theta=cfg.rope_theta,
                  vocab_size=cfg.vocab, num_hidden_layers=1, attn_implementation="sdpa")
    torch.manual_seed(0)
    layer = Qwen2DecoderLayer(hf, layer_idx=0).to(torch.float32).eval()
    ref_layer = copy.deepcopy(layer)
    x = torch.randn(args.batch, args.seq, cfg.hidden)
    cos, sin = rotary(torch.arange(args.seq), cfg.head_dim, cfg.rope_theta)
    cos, sin = cos[None], sin[None]
    pos = torch.arange(args.seq)[None]
    with torch.inference_mode():
        ref = _first(ref_layer(x, position_ids=pos, position_embeddings=(cos, sin)))
    layer.to("ahbm")
    with torch.inference_mode(), kbtorch.profile() as prof:
        out = _first(layer(x.to("ahbm"), position_ids=pos.to("ahbm"),
                           position_embeddings=(cos.to("ahbm"), sin.to("ahbm"))))
    return prof, out, ref


def _first(out):
    return out[0] if isinstance(out, tuple) else out
