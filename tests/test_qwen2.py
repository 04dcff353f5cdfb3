"""The plain-torch Qwen2 decoder (kbtorch/models/qwen2.py) on CPU and on the ahbm device."""
import torch

import kbtorch
from kbtorch.models.qwen2 import QWEN2_5_7B, TINY, DecoderLayer, Model, rotary


def _close(a, b, atol=2e-2):
    assert torch.allclose(a.cpu().float(), b.float(), atol=atol, rtol=2e-2), (a.cpu().float() - b.float()).abs().max()


def test_configs():
    assert (QWEN2_5_7B.hidden, QWEN2_5_7B.intermediate, QWEN2_5_7B.layers) == (3584, 18944, 28)
    assert (QWEN2_5_7B.heads, QWEN2_5_7B.kv_heads, QWEN2_5_7B.head_dim, QWEN2_5_7B.vocab) == (28, 4, 128, 151936)


def test_layer_is_causal_gqa_attention_plus_mlp():
    torch.manual_seed(0)
    layer = DecoderLayer(TINY)
    x = torch.randn(1, 5, TINY.hidden)
    cos, sin = rotary(torch.arange(5), TINY.head_dim, TINY.rope_theta)
    out, (k, v) = layer(x, cos, sin)
    assert out.shape == x.shape and k.shape == (1, TINY.kv_heads, 5, TINY.head_dim)
    prefix, _ = layer(x[:, :3], cos[:3], sin[:3])
    assert torch.allclose(prefix, out[:, :3], atol=1e-5)          # causal: later tokens do not matter


def test_two_layer_tiny_model_prefill_and_decode_on_ahbm_match_cpu():
    torch.manual_seed(0)
    model = Model(TINY).half().eval()
    tokens, pos = torch.randint(0, TINY.vocab, (1, 6)), torch.arange(6)
    nxt = torch.randint(0, TINY.vocab, (1, 1))
    with torch.no_grad():
        ref, caches = model(tokens, pos)
        ref_step, _ = model(nxt, torch.tensor([6]), caches)
        model.to("ahbm")
        with kbtorch.profile() as prof:
            out, dev_caches = model(tokens.to("ahbm"), pos)
            step, _ = model(nxt.to("ahbm"), torch.tensor([6]), dev_caches)
    _close(out, ref)
    _close(step, ref_step)
    names = {r.name for r in prof.records}
    assert {"aten::addmm", "aten::mm", "aten::scaled_dot_product_attention", "aten::cat", "aten::embedding"} <= names
    assert prof.total_ns > 0
