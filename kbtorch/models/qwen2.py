"""A Qwen2-style decoder in plain torch ``nn.Module``s (no kbtorch inside).

RMSNorm, q/k/v projections with bias, rotary position embedding (rotate-half form),
grouped-query attention through ``F.scaled_dot_product_attention(..., enable_gqa=True)``
with an optional KV cache, o_proj, SwiGLU MLP and residuals, as in Hugging Face's
``Qwen2DecoderLayer``. ``QWEN2_5_7B`` is the Qwen2.5-7B configuration; ``TINY`` is a small
one for tests. Move a layer or model to ``"ahbm"`` like any module.

Shapes: hidden states are ``[batch, seq, hidden]``; positions ``[seq]`` (absolute).

KV cache: a ``(k, v)`` tuple grows by ``torch.cat`` (as Hugging Face's dynamic cache); a
``KVCache`` is preallocated and written in place, one slice per step (as a static cache):
on the ahbm device that is a copy of the new tokens only, not of the whole cache.

Tensor-parallel mapping (``tensor_parallel``), Megatron-style over a flat mesh of P PEs:
q/k/v/gate/up are column-parallel (weight ``[out, in]`` sharded on ``out``: each PE makes
``out/P`` output features from a replicated input); o_proj and down_proj are row-parallel
(weight sharded on ``in``: each PE multiplies its slice of the features, the result is a
partial sum, reduced by an all-reduce, or a reduce-scatter over the sequence, when the
residual add uses it); norms' weights and biases of row-parallel layers are replicated,
biases of column-parallel layers sharded with their outputs. The placements alone say
this: the ahbm dispatch follows them (``kbtorch/tensor/placement/sharding.py``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Qwen2Config:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


QWEN2_5_7B = Qwen2Config(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=151936)
TINY = Qwen2Config(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=100)
CONFIGS = {"7b": QWEN2_5_7B, "tiny": TINY}


class KVCache:
    """A preallocated cache ``[batch, kv_heads, max_len, head_dim]`` holding ``length``
    positions; ``update`` writes the new keys and values in place and returns views of all."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, length: int = 0):
        if k.shape != v.shape or not 0 <= length <= k.shape[2]:
            raise ValueError(f"KVCache: k {tuple(k.shape)}, v {tuple(v.shape)}, length {length}")
        self.k, self.v, self.length = k, v, length

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[2]
        if end > self.k.shape[2]:
            raise ValueError(f"KVCache: {end} positions exceed its {self.k.shape[2]}")
        self.k[:, :, self.length:end].copy_(k)
        self.v[:, :, self.length:end].copy_(v)
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotary(positions: torch.Tensor, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [seq, dim] for absolute ``positions`` (computed on the host)."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Qwen2Config):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * d)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d)
        self.o_proj = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)

    def forward(self, x, cos, sin, cache=None):
        """``cache``: (k, v) of earlier positions, [batch, kv_heads, past, head_dim]; returns
        (output, new cache)."""
        b, s, _ = x.shape
        d, cfg = self.cfg.head_dim, self.cfg
        q = self.q_proj(x).view(b, s, cfg.heads, d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, cfg.kv_heads, d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, cfg.kv_heads, d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if isinstance(cache, KVCache):
            k, v = cache.update(k, v)
        elif cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        causal = s > 1 and k.shape[2] == s
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        out = self.o_proj(a.transpose(1, 2).reshape(b, s, cfg.heads * d))
        return out, cache if isinstance(cache, KVCache) else (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: Qwen2Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen2Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        a, cache = self.self_attn(self.input_layernorm(x), cos, sin, cache)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Model(nn.Module):
    """Embedding, decoder layers, final norm (no LM head: the layers are what is studied)."""

    def __init__(self, cfg: Qwen2Config, layers: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(layers or cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)

    def forward(self, tokens, positions, caches=None):
        """tokens [batch, seq] -> (hidden [batch, seq, hidden], new caches)."""
        cos, sin = rotary(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed_tokens(tokens)
        cos, sin = cos.to(device=x.device, dtype=x.dtype), sin.to(device=x.device, dtype=x.dtype)
        new = []
        for i, layer in enumerate(self.layers):
            x, c = layer(x, cos, sin, None if caches is None else caches[i])
            new.append(c)
        return self.norm(x), new


COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def place(module: nn.Module, placement_of, mesh=None) -> nn.Module:
    """Place every parameter of ``module`` (already on ``"ahbm"``) over ``mesh`` (default:
    every PE of the current machine, flat) by ``placement_of(leaf module name, parameter
    name)``. Returns ``module``."""
    import kbtorch
    n = len(kbtorch.current_machine().pes)
    mesh = mesh or kbtorch.Mesh(tuple(range(n)), (n,))
    for name, sub in module.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        for pname, p in list(sub.named_parameters(recurse=False)):
            placed = kbtorch.distribute_tensor(p.data, mesh, [placement_of(leaf, pname)])
            setattr(sub, pname, nn.Parameter(placed, requires_grad=p.requires_grad))
    return module


def tensor_parallel(module: nn.Module, mesh=None) -> nn.Module:
    """Place ``module``'s parameters for tensor parallelism over ``mesh``: see the module
    docstring. Returns ``module``."""
    import kbtorch

    def rule(leaf: str, pname: str):
        if leaf in COLUMN:
            return kbtorch.Shard(0)
        if leaf in ROW and pname == "weight":
            return kbtorch.Shard(1)
        return kbtorch.Replicate()
    return place(module, rule, mesh)
