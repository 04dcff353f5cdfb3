"""Unmodified Hugging Face causal LMs on ahbm, built from configs (never downloaded).

``CONFIGS`` names full-size configurations (Qwen2.5-7B, Llama-3-8B, Mistral-7B, the
Mixtral-8x7B mixture of experts) and ``tiny`` ones of the same families (2 layers, small
widths) for numerics. ``build`` makes the model: tiny ones with seeded random weights (and
a CPU copy to check against), full-size ones on the meta device for timing-only runs (no
weight is ever materialised). ``place_tp`` places a model on ahbm as
``kbtorch.models.qwen2.tensor_parallel`` does a decoder layer (column-parallel q/k/v/gate/up,
row-parallel o/down), everything else by default (the embedding and the LM head sharded
on the vocabulary). ``fuse_norms`` runs the model's RMSNorm layers as torch's fused
``rms_norm``, as a serving stack's kernel does. Needs the optional extra ``hf`` (transformers).
"""
from __future__ import annotations

import copy
import types

import torch

from .qwen2 import COLUMN, ROW

#: name -> (transformers config class, model class, config arguments)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
}
CONFIGS = {
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)),
    "llama3-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                rope_theta=500_000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)),
    "mistral-7b": ("mistral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                   rms_norm_eps=1e-5, max_position_embeddings=32768, sliding_window=None)),
    "mixtral-8x7b": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                     num_local_experts=8, num_experts_per_tok=2, rope_theta=1_000_000.0,
                                     rms_norm_eps=1e-5, max_position_embeddings=32768)),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256)
TINY_EXTRA = {"mixtral": dict(num_local_experts=4, num_experts_per_tok=2), "mistral": dict(sliding_window=None)}
#: token ids no test prompt uses: generation never stops early.
EOS = 1


def config(name: str):
    """The transformers config of ``name`` (a key of ``CONFIGS``, or ``tiny-FAMILY``)."""
    import transformers
    if name.startswith("tiny-"):
        family = name.removeprefix("tiny-")
        args = dict(TINY, **TINY_EXTRA.get(family, {}))
    else:
        family, args = CONFIGS[name]
    cls = getattr(transformers, FAMILIES[family][0])
    if family == "mixtral":
        # NOTE: the experts loop (routing by topk, dispatch by index ops), not grouped_mm.
        args = dict(args, experts_implementation="eager")
    return family, cls(**args, attn_implementation="sdpa", eos_token_id=EOS, pad_token_id=0, bos_token_id=EOS,
                       tie_word_embeddings=False)


def build(name: str, dtype=torch.float32, timing_only: bool = False, seed: int = 0):
    """(model on CPU or meta, CPU copy for a check or None), in eval mode."""
    import transformers
    family, cfg = config(name)
    cls = getattr(transformers, FAMILIES[family][1])
    if timing_only:
        with torch.device("meta"):
            return cls(cfg).to(dtype).eval(), None
    torch.manual_seed(seed)
    model = cls(cfg).to(dtype).eval()
    return model, copy.deepcopy(model)


def place_tp(model):
    """Place ``model``'s parameters (on ahbm) as the module docstring says. Returns it."""
    import kbtorch
    from kbtorch.tensor.placement import default_spec
    machine = kbtorch.current_machine()
    n = len(machine.pes)
    mesh = kbtorch.Mesh(tuple(range(n)), (n,))
    for name, sub in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        for pname, p in list(sub.named_parameters(recurse=False)):
            if leaf in COLUMN and p.dim() == 2:
                placed = kbtorch.Shard(0)
            elif leaf in ROW and pname == "weight":
                placed = kbtorch.Shard(1)
            else:
                placed = default_spec(machine, tuple(p.shape)).placements[0]
            setattr(sub, pname, torch.nn.Parameter(kbtorch.distribute_tensor(p.data, mesh, [placed]),
                                                   requires_grad=False))
    return model


def _fused_rms_norm(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.rms_norm``: the norm in fp32, cast back, times the weight: the
    same arithmetic as the Hugging Face layers' forward, in one op."""
    return torch.nn.functional.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight,
                                        self.variance_epsilon)


def fuse_norms(model) -> int:
    """Run every RMSNorm layer of ``model`` (Hugging Face's kernel-hub layer name
    ``"RMSNorm"``: a class named ``*RMSNorm`` with ``weight`` and ``variance_epsilon``) as one
    fused ``rms_norm`` op instead of its eager chain (cast, pow, mean, add, rsqrt, mul, cast,
    mul). Returns how many layers it set. The model's code is unchanged: the instances'
    ``forward`` is replaced, as ``kernels.kernelize`` replaces it with a hub kernel on CUDA.

    NOTE: ``torch.nn.functional.rms_norm`` computes as those layers do (upcast to fp32,
    ``x * rsqrt(mean(x^2) + eps)``, cast to the input's dtype, multiply by the weight)."""
    count = 0
    for module in model.modules():
        if (type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.Tensor)
                and isinstance(getattr(module, "variance_epsilon", None), float)):
            module.forward = types.MethodType(_fused_rms_norm, module)
            count += 1
    return count
