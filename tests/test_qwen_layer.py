"""examples/qwen_layer.py and the tensor-parallel Qwen2 layer on ahbm."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import kbtorch
from kbtorch.models.qwen2 import TINY, DecoderLayer, tensor_parallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import qwen_layer  # noqa: E402


def _run(capsys, *argv):
    code = qwen_layer.main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("argv", [("--seq", "9"), ("--kv-len", "7"), ("--seq", "5", "--batch", "2"),
                                  ("--seq", "6", "--mapping", "grid")])
def test_tiny_layer_matches_cpu(capsys, argv):
    code, rec = _run(capsys, "--config", "tiny", "--check", *argv)
    assert code == 0 and rec["allclose"] and rec["max_abs_err"] < 5e-2
    assert rec["latency_ns"] > 0 and rec["ops"] and all(op["latency_ns"] > 0 for op in rec["ops"])


def test_7b_layer_timing_only_prefill_and_decode(capsys):
    _, pre = _run(capsys, "--seq", "8")
    assert pre["latency_ns"] > 0 and "tokens_per_s" not in pre
    _, dec = _run(capsys, "--kv-len", "64")
    assert dec["tokens_per_s"] > 0 and 0 < dec["pct_hbm"] < 100 and dec["wall_s"] > 0
    names = [op["name"] for op in dec["ops"]]
    assert "redistribute Partial()->Replicate()" in names      # row-parallel o_proj and down_proj
    assert names.count("redistribute Partial()->Replicate()") == 2


def test_tensor_parallel_placements_and_row_parallel_partials():
    torch.manual_seed(0)
    layer = DecoderLayer(TINY).to("ahbm")
    tensor_parallel(layer)
    attn, mlp = layer.self_attn, layer.mlp
    assert attn.q_proj.weight.placements == (kbtorch.Shard(0),) and attn.q_proj.bias.placements == (kbtorch.Shard(0),)
    assert attn.o_proj.weight.placements == (kbtorch.Shard(1),) and mlp.down_proj.weight.placements == (kbtorch.Shard(1),)
    assert layer.input_layernorm.weight.placements == (kbtorch.Replicate(),)
    x = torch.randn(3, TINY.hidden).to("ahbm")
    with torch.inference_mode(), kbtorch.profile() as prof:
        h = mlp.gate_proj(x)
        y = mlp.down_proj(h)
    assert h.placements == (kbtorch.Shard(1),) and y.placements == (kbtorch.Partial(),)
    assert [r.detail.split(" x")[0] for r in prof.records] == ["column-parallel", "row-parallel"]
    assert torch.allclose(y.cpu(), x.cpu() @ mlp.gate_proj.weight.cpu().t() @ mlp.down_proj.weight.cpu().t(), atol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_hugging_face_layer_matches_cpu(capsys):
    code, rec = _run(capsys, "--hf", "--config", "tiny", "--seq", "7", "--check")
    assert code == 0 and rec["allclose"]
