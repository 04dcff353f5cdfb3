"""Unmodified Hugging Face causal LMs on ahbm, built from configs (never downloaded).

``CONFIGS`` names full-size configurations (Qwen2.5-7B and -72B, Llama-3-8B and -70B,
Mistral-7B, the mixtures of experts Mixtral-8x7B and -8x22B, Qwen3-30B-A3B and DeepSeek-V3
with multi-head latent attention) and ``tiny-FAMILY`` ones of those families and OLMoE (2
layers, small widths) for numerics; any other causal LM comes from its config.json or a
local snapshot folder (``AutoConfig``, ``AutoModelForCausalLM.from_config``). ``build`` makes the model: tiny ones with seeded random weights (and
a CPU copy to check against), full-size ones on the meta device for timing-only runs (no
weight is ever materialised). ``place_tp`` places a model on ahbm as
``kbtorch.models.qwen2.tensor_parallel`` does a decoder layer (column-parallel q/k/v/gate/up,
row-parallel o/down), everything else by default (the embedding and the LM head sharded
on the vocabulary). ``fuse_norms`` runs the model's RMSNorm layers as torch's fused
``rms_norm``, as a serving stack's kernel does. Needs the optional extra ``hf`` (transformers).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import types

import torch

from .qwen2 import COLUMN, ROW

#: Presets: name -> (``model_type``, config arguments), the published config.json values of
#: each model (architecture only; no weights are ever read).
CONFIGS = {
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)),
    "qwen2.5-72b": ("qwen2", dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                                  num_attention_heads=64, num_key_value_heads=8, vocab_size=152064,
                                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)),
    "llama3-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                rope_theta=500_000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)),
    "llama3-70b": ("llama", dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                 num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                                 rope_theta=500_000.0, rms_norm_eps=1e-5, max_position_embeddings=8192)),
    "mistral-7b": ("mistral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                   rms_norm_eps=1e-5, max_position_embeddings=32768, sliding_window=None)),
    "mixtral-8x7b": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                     num_local_experts=8, num_experts_per_tok=2, rope_theta=1_000_000.0,
                                     rms_norm_eps=1e-5, max_position_embeddings=32768)),
    "mixtral-8x22b": ("mixtral", dict(hidden_size=6144, intermediate_size=16384, num_hidden_layers=56,
                                      num_attention_heads=48, num_key_value_heads=8, vocab_size=32768,
                                      num_local_experts=8, num_experts_per_tok=2, rope_theta=1_000_000.0,
                                      rms_norm_eps=1e-5, max_position_embeddings=65536)),
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                        head_dim=128, vocab_size=151936, num_experts=128, num_experts_per_tok=8,
                                        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                                        rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=40960)),
    "deepseek-v3": ("deepseek_v3", dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                                        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                                        vocab_size=129280, n_routed_experts=256, n_shared_experts=1,
                                        num_experts_per_tok=8, n_group=8, topk_group=4, first_k_dense_replace=3,
                                        routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=512,
                                        q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                        rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=163840,
                                        rope_scaling=dict(type="yarn", factor=40.0, beta_fast=32, beta_slow=1,
                                                          mscale=1.0, mscale_all_dim=1.0,
                                                          original_max_position_embeddings=4096))),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256)
#: Tiny presets ``tiny-FAMILY``: TINY plus each family's own fields (small routers, MLA ranks).
TINY_EXTRA = {
    "qwen2": {}, "llama": {}, "mistral": dict(sliding_window=None),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3-moe": dict(model_type="qwen3_moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      head_dim=16, decoder_sparse_step=1, mlp_only_layers=[]),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "deepseek-v3": dict(model_type="deepseek_v3", num_key_value_heads=4, moe_intermediate_size=32,
                        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16),
}
#: token ids no test prompt uses: generation never stops early.
EOS = 1


def config(name: str, attn: str = "auto"):
    """The transformers config of ``name``: a preset (a key of ``CONFIGS``, or ``tiny-FAMILY``
    of ``TINY_EXTRA``), a config.json, or a local snapshot folder holding one. Never a
    download: files are read with ``local_files_only`` and HF_HUB_OFFLINE set. ``attn``: the
    attention implementation (``attention``)."""
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if importlib.util.find_spec("transformers") is None:
        raise ValueError(f"model '{name}': Hugging Face models need the optional extra 'hf' (transformers): "
                         f"pip install -e \".[hf]\" (a clone) or pip install \"kbtorch[hf]\" (a wheel)")
    import transformers
    if name in CONFIGS or name.removeprefix("tiny-") in TINY_EXTRA and name.startswith("tiny-"):
        if name in CONFIGS:
            model_type, args = CONFIGS[name]
        else:
            args = dict(TINY, **TINY_EXTRA[name.removeprefix("tiny-")])
            model_type = args.pop("model_type", name.removeprefix("tiny-"))
        if model_type == "mixtral":
            # NOTE: the experts loop (routing by topk, dispatch by index ops), not grouped_mm.
            args = dict(args, experts_implementation="eager")
        cfg = transformers.AutoConfig.for_model(model_type, **args, eos_token_id=EOS, pad_token_id=0,
                                                bos_token_id=EOS, tie_word_embeddings=False)
        cfg._attn_implementation = attention(cfg, attn)
        return cfg
    path = os.path.expanduser(name)
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model '{name}': the folder has no config.json")
    if not os.path.exists(path):
        presets = ", ".join([*CONFIGS, *(f"tiny-{f}" for f in TINY_EXTRA)])
        raise ValueError(f"model '{name}': not a preset ({presets}), a config.json or a folder holding one")
    try:
        cfg = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"model '{name}': {str(exc).splitlines()[0]}") from None
    cfg._attn_implementation = attention(cfg, attn)
    return cfg


def attention(cfg, attn: str = "auto") -> str:
    """The attention implementation of ``cfg``'s causal LM: ``"eager"``, ``"sdpa"``, or for
    ``"auto"`` sdpa where the model class supports it (``_supports_sdpa``), else eager
    (bloom, gemma2, gpt_oss)."""
    import transformers
    if attn not in ("auto", "eager", "sdpa"):
        raise ValueError(f"argument --attn: '{attn}' is not auto, eager or sdpa")
    if attn != "auto":
        return attn
    cls = transformers.AutoModelForCausalLM._model_mapping.get(type(cfg), None)
    return "sdpa" if cls is not None and getattr(cls, "_supports_sdpa", False) else "eager"


def build(name: str, dtype=torch.float32, timing_only: bool = False, seed: int = 0, attn: str = "auto"):
    """(model on CPU or meta, CPU copy for a check or None), in eval mode: any causal LM
    ``AutoModelForCausalLM`` builds from the config of ``name`` (see ``config``; ``attn``: the
    attention implementation, ``attention``)."""
    import transformers
    cfg = config(name, attn)
    if timing_only:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(cfg).to(dtype).eval(), None
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    return model, copy.deepcopy(model)


def place_tp(model):
    """Place ``model``'s parameters (on ahbm) as the module docstring says. Returns it."""
    import kbtorch
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
                placed = kbtorch.default_spec(machine, tuple(p.shape)).placements[0]
            setattr(sub, pname, torch.nn.Parameter(kbtorch.distribute_tensor(p.data, mesh, [placed]),
                                                   requires_grad=False))
    return model


def place_plan(model, tp: int | None = None, dp: int = 1) -> tuple:
    """Move ``model`` to ahbm and place it by the plan of the current machine; -> (the plan
    in words, the mesh of the replica to run in (``kbtorch.home``), None without ``dp``).

    On one chip (``tp`` None or 1): ``place_tp``, tensor parallel over all its PEs. On a
    system of chips (default ``tp``: every chip over ``dp``): the mesh (``dp`` x chips x PEs
    per chip, ``kbtorch.init_device_mesh``) and ``kbtorch.tp_plan`` along the chip and PE
    dimensions of replica 0 (``kbtorch.replica``): tensor parallel across its chips and
    inside each; o/down row-parallel across chips and column-parallel inside each
    (``tp_plan(inside="pe")``), so that their partial sums are reduced across chips only,
    on 1/PEs of the result each (NOTE: Llama-3-70B decode on maia200_x8, 3 layers as one
    graph: 269.9 -> 242.7 us; eager 436.6 -> 418.7 us). With ``dp`` > 1 the model lies on
    replica 0's PEs and the caller runs that replica's share of the batch inside
    ``kbtorch.home(replica)``. NOTE: replicas exchange nothing in inference, each on chips of
    its own: the others take the same time (symmetry); what they would share, switches
    above the replica, is not contended in the simulation."""
    import kbtorch
    machine = kbtorch.current_machine()
    chips, n = machine.chips, len(machine.pes)
    tp = chips // dp if tp is None else tp
    if tp * dp != chips:
        raise ValueError(f"arguments --tp {tp} x --dp {dp}: topology '{machine.name}' has {chips} "
                         f"chip{'s' if chips > 1 else ''}; tensor parallelism spans the chips of a replica "
                         f"(--tp x --dp = {chips})")
    if chips == 1:
        model.to("ahbm")
        place_tp(model)
        return (f"tensor parallel over the {n} PEs of one chip (1-D mesh): q/k/v/gate/up column-, o/down "
                f"row-parallel"), None
    mesh = kbtorch.init_device_mesh((dp, tp, n // chips), ("dp", "chip", "pe"))
    one = kbtorch.replica(mesh, "dp")
    with kbtorch.home(one) if dp > 1 else contextlib.nullcontext():
        model.to("ahbm")
        kbtorch.parallelize_module(model, one, kbtorch.tp_plan(model, one, inside="pe"))
    text = (f"tensor parallel {tp} chips x {n // chips} PEs (mesh {one.shape}, dims {one.names}, TP {tp}): "
            f"q/k/v/gate/up/lm_head column-, o/down row-parallel across chips and column-parallel inside each, "
            f"embedding vocab-parallel, norms replicated, other layers by default")
    if dp > 1:
        text += (f"; data parallel {dp} replicas (mesh {mesh.shape}, dims {mesh.names}): replica 0 simulated with "
                 f"its share of the batch, the others the same on their own chips")
    return text, one if dp > 1 else None


def kv_cache(cfg, batch: int, positions: int, eb: int) -> list:
    """The key and value tensors a KV cache of ``batch`` x ``positions`` holds for every
    layer of ``cfg``: ``(name, shape, bytes)``. NOTE: read through transformers' own accessors
    (``get_text_config`` and each config's ``attribute_map``: GPT-2's ``n_head`` is
    ``num_attention_heads``), so any causal LM config answers; a config without
    ``num_key_value_heads`` caches every attention head (multi-head attention). Multi-head
    latent attention (DeepSeek-V3) caches keys of ``qk_head_dim`` and values of ``v_head_dim``."""
    text = cfg.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head = getattr(text, "head_dim", None) or text.hidden_size // heads
    dims = {"keys": getattr(text, "qk_head_dim", head), "values": getattr(text, "v_head_dim", head)}
    held = layer_positions(cfg, positions)
    return [(f"cache.layers.{i}.{kind}", shape, eb * batch * kv_heads * n * dim)
            for i, n in enumerate(held) if n for kind, dim in dims.items()
            for shape in [(batch, kv_heads, n, dim)]]


def layer_positions(cfg, positions: int) -> list:
    """The positions each layer's KV cache holds after ``positions`` tokens, by the layers of
    transformers' own ``DynamicCache`` for ``cfg``: a sliding-window layer at most its window
    (Gemma 2/3, Mistral, gpt-oss), a layer that keeps no keys and values (a Mamba mixer of
    Jamba: its fixed-size state is not a KV cache) none, any other every position.
    NOTE: a config transformers' cache cannot read (an older remote-code model) holds every
    position in every layer: an upper bound."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer
    text = cfg.get_text_config()
    try:
        layers = DynamicCache(config=cfg).layers
    except (AttributeError, TypeError, ValueError):
        return [positions] * text.num_hidden_layers
    held = []
    for layer in layers:
        window = getattr(layer, "sliding_window", None)
        held.append(0 if not isinstance(layer, DynamicLayer) else min(positions, window) if window else positions)
    return held


def check_cache_fits(model, batch: int, positions: int) -> None:
    """``HbmFull`` before any work if the KV cache ``model.generate()`` grows to (``batch`` x
    ``positions``, in the weights' dtype) would not fit the HBM its weights left free on the
    current machine (of the current scope, ``kbtorch.home``): named by its first layer past a
    node's free bytes, the node and its PE. NOTE: placed by default (sharded over the PEs);
    a chip's PEs share one HBM node, so how the heads split inside a chip does not matter."""
    import kbtorch
    eb = next(model.parameters()).element_size()
    kbtorch.check_hbm(f"the KV cache of batch {batch} x {positions} positions", kv_cache(model.config, batch, positions, eb))


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
        # NOTE: a parameter: a layer whose ``weight`` is a buffer it never uses (FalconMamba's
        # ``WeightlessRMSNorm``, sized for another dimension) keeps its own forward.
        if (type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.nn.Parameter)
                and isinstance(getattr(module, "variance_epsilon", None), float)):
            module.forward = types.MethodType(_fused_rms_norm, module)
            count += 1
    return count
