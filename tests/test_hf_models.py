"""Unmodified Hugging Face causal LMs (built from tiny configs, seeded random weights) on
ahbm against CPU: logits of ``model(ids)`` and greedy ``generate()`` tokens, batch 1 and
batch 4 with left padding (attention_mask)."""
import pytest
import torch

pytest.importorskip("transformers")

from kbtorch.models.hf import build  # noqa: E402

MODELS = ("tiny-qwen2", "tiny-llama", "tiny-mistral", "tiny-mixtral")
#: MoE routing by histc and grouped GEMMs (transformers' default experts), DeepSeek-V3 with MLA.
MOE = ("tiny-qwen3-moe", "tiny-olmoe", "tiny-deepseek-v3")


def _prompt(batch: int):
    ids = torch.randint(2, 128, (batch, 6), generator=torch.Generator().manual_seed(batch))
    mask = torch.ones_like(ids)
    for row in range(1, batch, 2):
        mask[row, :row] = 0
    return ids, mask


@pytest.mark.parametrize("name,batch", [(n, b) for n in MODELS for b in (1, 4)] + [(n, 4) for n in MOE])
def test_forward_and_generate_match_cpu(name, batch):
    model, ref = build(name)
    ids, mask = _prompt(batch)
    model.to("ahbm")
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = model(ids.to("ahbm"), attention_mask=mask.to("ahbm")).logits.cpu()
        torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-4)
        gen = dict(max_new_tokens=3, do_sample=False)
        expect = ref.generate(ids, attention_mask=mask, **gen)
        assert torch.equal(model.generate(ids.to("ahbm"), attention_mask=mask.to("ahbm"), **gen).cpu(), expect)


@pytest.mark.parametrize("name", MODELS)
def test_fused_norms_are_one_op_with_the_eager_values(name):
    import kbtorch
    from kbtorch.models.hf import fuse_norms
    model, ref = build(name)
    assert fuse_norms(model) == 2 * model.config.num_hidden_layers + 1
    ids, mask = _prompt(2)
    model.to("ahbm")
    with torch.no_grad(), kbtorch.profile() as prof:
        got = model(ids.to("ahbm"), attention_mask=mask.to("ahbm")).logits.cpu()
    want = ref(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-4)
    names = [r.name for r in prof.records]
    assert names.count("aten::rms_norm") == 2 * model.config.num_hidden_layers + 1
    assert "aten::pow" not in names and "aten::rsqrt" not in names


def test_static_cache_generate_matches_cpu():
    model, ref = build("tiny-qwen2")
    ids, mask = _prompt(4)
    gen = dict(max_new_tokens=3, do_sample=False, cache_implementation="static")
    model.to("ahbm")
    with torch.no_grad():
        expect = ref.generate(ids, attention_mask=mask, **gen)
        assert torch.equal(model.generate(ids.to("ahbm"), attention_mask=mask.to("ahbm"), **gen).cpu(), expect)


@pytest.mark.parametrize("name", MOE)
def test_moe_experts_run_grouped_gemms_of_routed_experts_only(name):
    import kbtorch
    model, _ = build(name)
    ids, _ = _prompt(1)
    model.to("ahbm")
    with torch.no_grad(), kbtorch.profile() as prof:
        model(ids[:, :1].to("ahbm"))
    names = [r.name for r in prof.records]
    cfg = model.config
    moe_layers = cfg.num_hidden_layers - getattr(cfg, "first_k_dense_replace", 0)
    assert names.count("aten::histc") == moe_layers
    # one token, top-k experts: gate/up and down GEMMs for k experts of each MoE layer
    assert names.count("aten::_grouped_mm") == 2 * cfg.num_experts_per_tok * moe_layers


def test_a_config_json_or_snapshot_folder_builds_the_model(tmp_path):
    from kbtorch.models.hf import config
    config("tiny-olmoe").save_pretrained(tmp_path)
    for where in (tmp_path, tmp_path / "config.json"):
        model, ref = build(str(where))
        assert type(model).__name__ == "OlmoeForCausalLM" and model.config.num_experts == 4
    with pytest.raises(ValueError, match="model 'nowhere': not a preset .*tiny-deepseek-v3"):
        config("nowhere")
    with pytest.raises(ValueError, match="the folder has no config.json"):
        config(str(tmp_path / "empty") if (tmp_path / "empty").mkdir() is None else "")


def test_a_kv_cache_past_the_hbm_left_is_refused_before_any_work():
    """``check_cache_fits``: the cache of batch x positions against the HBM the weights left,
    named by its first layer past a node's free bytes; nothing is booked either way."""
    from pathlib import Path

    import kbtorch
    from kbtorch.models.hf import check_cache_fits, kv_cache
    from kbtorch.tensor.hbm import HbmFull, hbm_book
    model, _ = build("tiny-llama", torch.bfloat16, timing_only=True)
    assert [(n, s) for n, s, _ in kv_cache(model.config, 2, 16, 2)][:2] == \
        [("cache.layers.0.keys", (2, 2, 16, 16)), ("cache.layers.0.values", (2, 2, 16, 16))]
    with kbtorch.use(str(Path(__file__).parent / "data" / "tiny.toml")) as machine, kbtorch.timing_only():
        model.to("ahbm")
        free = hbm_book(machine).free(0)
        check_cache_fits(model, 4, 64)
        # 2 layers x keys and values x 2 heads x 16 x 2 bytes = 256 bytes a position and row,
        # spread over every HBM node: twice what they have free
        rows = 2 * len(hbm_book(machine).nodes) * free // (256 * 2**20) + 1
        with pytest.raises(HbmFull, match=rf"the KV cache of batch {rows} x {2**20} positions does not fit the HBM "
                                          r"of 'tiny' \(.* GB in all\): 'cache\.layers\.[01]\.(keys|values)'"):
            check_cache_fits(model, rows, 2**20)
        assert hbm_book(machine).free(0) == free


@pytest.mark.parametrize("model_type, extra, held", [
    ("gemma2", dict(sliding_window=8, head_dim=16, num_key_value_heads=2), [8, 100]),    # sliding, then full
    ("mistral", dict(sliding_window=8, head_dim=16, num_key_value_heads=2), [8, 8]),
    ("jamba", dict(num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1, num_experts=2,
                   use_mamba_kernels=False), [0, 100]),                                   # a Mamba mixer, attention
    ("llama", dict(num_key_value_heads=2), [100, 100]),
])
def test_the_kv_cache_holds_what_each_layer_of_transformers_cache_keeps(model_type, extra, held):
    """Sliding-window layers hold their window, state-space layers no keys and values: the
    layers of transformers' own DynamicCache for the config, not every layer at full length."""
    import transformers

    from kbtorch.models.hf import kv_cache, layer_positions
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                            num_attention_heads=4, vocab_size=128, **extra)
    assert layer_positions(cfg, 100) == held
    per_position = 2 * 2 * 16 * 2                        # keys and values x 2 heads x 16 x 2 bytes
    assert sum(b for _, _, b in kv_cache(cfg, 1, 100, 2)) == per_position * sum(held)
