"""``examples/hf_generate.py --model CONFIG.json --check`` for causal LM families built from
tiny config.json files (hidden 64, 2 layers, 4 heads, vocab 128): the KV cache measured from
any config, attention auto (eager where sdpa is unsupported), logits and tokens against CPU."""
import importlib.util
import json
import pathlib

import pytest

pytest.importorskip("transformers")

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
            max_position_embeddings=256, eos_token_id=1, bos_token_id=1, pad_token_id=0)
FAMILIES = {
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
    "gpt_neox": {}, "opt": dict(ffn_dim=128, word_embed_proj_dim=64), "gptj": dict(n_embd=64, n_layer=2, n_head=4,
                                                                              rotary_dim=8, n_positions=256),
    "bloom": dict(n_layer=2, n_head=4), "gemma2": dict(num_key_value_heads=2, head_dim=16),
    "gpt_oss": dict(num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2),
    "llama": dict(num_key_value_heads=2), "qwen2": dict(num_key_value_heads=2),
    "cohere": {}, "falcon": dict(num_kv_heads=2, new_decoder_architecture=True),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=16), "granite": {}, "mpt": dict(d_model=64, n_heads=4, n_layers=2),
    "mistral": dict(num_key_value_heads=2, head_dim=16), "mixtral": dict(num_key_value_heads=2, num_local_experts=4,
                                                                         num_experts_per_tok=2),
    "olmoe": dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2), "phi3": {},
    "qwen3": dict(num_key_value_heads=2, head_dim=16), "qwen3_moe": dict(num_key_value_heads=2, num_experts=4,
                                                                         num_experts_per_tok=2, moe_intermediate_size=32,
                                                                         head_dim=16),
    "stablelm": dict(num_key_value_heads=2), "starcoder2": {},
    # complex rotary embeddings (torch.polar, complex multiplies): MLA with q_lora_rank null
    "deepseek_v2": dict(q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                        n_shared_experts=1, num_key_value_heads=4, topk_method="greedy", n_group=1, topk_group=1),
    # state-space layers: the depthwise causal Conv1d (aten.convolution), weightless RMSNorms
    "mamba": dict(state_size=8, expand=2, conv_kernel=4, time_step_rank=8),
    "falcon_mamba": dict(state_size=8, expand=2, conv_kernel=4, time_step_rank=8),
    "jamba": dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, expert_layer_period=2,
                  attn_layer_period=2, attn_layer_offset=1, mamba_d_state=8, mamba_expand=2, mamba_d_conv=4,
                  mamba_dt_rank=8, use_mamba_kernels=False),
}


def _main():
    path = pathlib.Path(__file__).parent.parent / "examples" / "hf_generate.py"
    spec = importlib.util.spec_from_file_location("hf_generate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


@pytest.mark.parametrize("family", FAMILIES)
def test_config_json_family_checks_against_cpu(family, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(BASE, model_type=family, **FAMILIES[family])))
    rc = _main()(["--model", str(cfg), "--check", "--prompt-len", "6", "--new-tokens", "2", "--json"])
    rec = json.loads(capsys.readouterr().out)
    assert rec["tokens_match_cpu"] and rec["max_abs_logit_diff"] <= rec["logit_tolerance"], rec
    assert rc == 0


def test_peak_modelled_hbm_per_chip_in_eager_and_graph_mode(capsys):
    """Each chip's peak modelled HBM is reported in both modes; graph mode frees at last use,
    so its peak stays near eager's (it held every buffer of a capture before)."""
    rc = _main()(["--model", "tiny-llama", "--topology", "tests/data/tiny_system.toml", "--prompt-len", "8",
                  "--new-tokens", "2", "--mode", "both", "--json"])
    recs = json.loads(capsys.readouterr().out)
    assert rc == 0
    eager, graph = (recs[m]["hbm_peak_bytes"] for m in ("eager", "graph"))
    assert sorted(map(int, eager)) == [0, 1, 2, 3] and all(v > 0 for v in eager.values())
    assert all(graph[c] <= 1.1 * eager[c] for c in eager), (eager, graph)


def test_fidelity_is_chosen_and_reported(capsys):
    """``--fidelity`` sets the fidelity of the whole run and the record says how its figures
    were obtained (``Profile.obtained``); this tiny run has nothing to skip, so both give
    the same figures, every event simulated."""
    args = ["--model", "tiny", "--prompt-len", "6", "--new-tokens", "2", "--json"]
    recs = {}
    for fid in ("exact", "auto"):
        assert _main()(args + ["--fidelity", fid]) == 0
        recs[fid] = json.loads(capsys.readouterr().out)
    for fid, rec in recs.items():
        o = rec["obtained"]
        assert rec["fidelity"] == fid and o["events_simulated"] > 0 and o["events_skipped"] == 0, o
        assert set(o["ops_by_fidelity"]) == {fid} and sum(o["ops_by_method"].values()) > 0, o
    # NOTE: to the ps, not the bit: the step clock is a float that runs on across runs in one process.
    for key in ("ttft_ns", "tpot_ns"):
        assert abs(recs["exact"][key] - recs["auto"][key]) < 1e-3, key


def test_missing_extras_are_one_line_naming_both_installs(monkeypatch, capsys):
    """Without transformers (the 'hf' extra) or the sweep's libraries, the user gets one line
    naming the extra and the install command for a clone and for a wheel, no traceback."""
    import importlib.util
    from kbtorch.cli import main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("transformers", "dask") else real(name, *a))
    from kbtorch.models.hf import config
    with pytest.raises(ValueError, match=r"optional extra 'hf'.*pip install -e \"\.\[hf\]\".*pip install \"kbtorch\[hf\]\""):
        config("tiny-llama")
    rc = main(["sweep", "qwen_layer"])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "'sweep'" in err and 'pip install -e ".[sweep]"' in err and 'pip install "kbtorch[sweep]"' in err


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_attn_choice_is_the_models_and_both_match_cpu(attn, capsys):
    from kbtorch.models.hf import config
    assert config("tiny-llama", attn)._attn_implementation == attn
    rc = _main()(["--model", "tiny-llama", "--attn", attn, "--check", "--prompt-len", "6", "--new-tokens", "2", "--json"])
    rec = json.loads(capsys.readouterr().out)
    assert rc == 0 and rec["matches_cpu"], rec


def test_check_beyond_the_tolerance_exits_1_and_says_so(monkeypatch, capsys):
    """A tolerance no result can meet: --check reports the difference and exits 1."""
    main = _main()
    monkeypatch.setitem(main.__globals__["LOGIT_TOLERANCE"], __import__("torch").float32, -1.0)
    rc = main(["--model", "tiny-llama", "--check", "--prompt-len", "6", "--new-tokens", "2"])
    captured = capsys.readouterr()
    assert rc == 1 and "differs from CPU beyond the tolerance" in captured.err
    assert "greedy tokens match: True" in captured.out
