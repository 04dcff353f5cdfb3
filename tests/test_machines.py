"""Every op family on a machine unlike AHBM (tests/data/diewide.toml: die-wide HBM, other
engine names and peaks), and the machine API the kernels ask their facts of."""
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from kbtorch.cli import main
from kbtorch.ops.attention import attention
from kbtorch.ops.attention import reference as attention_reference
from kbtorch.ops.collective import all_reduce, torch_reference
from kbtorch.ops.vector import elementwise
from kbtorch.ops.gemm import gemm
from kbtorch.topology import as_machine, current_machine, load_machine, use

DIEWIDE = str(Path(__file__).parent / "data" / "diewide.toml")


@pytest.fixture(scope="module")
def die():
    return load_machine(DIEWIDE)


def test_facts_come_from_the_file(die):
    assert die.peak_tflops("bf16") == 8 * 16.0 and die.peak_tflops("fp8", pes=[0]) == 64.0
    assert die.dtypes() == ("f16", "bf16", "fp32", "fp8")
    assert die.math_flops("silu") == 3 and die.capacity("tcm", 5) == int(7.5 * 2**20)
    assert die.memory(3, "hbm") == "hbm" and die.memory(3, "sram") is None
    assert die.sharers("hbm") == tuple(range(8))
    assert die.hbm_gbps(range(8)) == die.hbm_gbps([0]) == 1024.0       # one memory, counted once
    assert die.pes[2].node("gemm") == "tile2.ttu" and die.pes[2].node("dma_rd") == "tile2.dma_in"
    with pytest.raises(ValueError, match="no peak for dtype 'fp8'"):
        die.engine_tflops(0, "math", "fp8")
    with pytest.raises(ValueError, match="no cost for op 'tanh'"):
        die.math_flops("tanh")


def test_gemm_numerics_and_peak(die):
    a, b = torch.randn(100, 70, dtype=torch.bfloat16), torch.randn(70, 90, dtype=torch.bfloat16)
    run = gemm(a, b, machine=die)
    assert torch.allclose(run.c.float(), a.float() @ b.float(), atol=0.1, rtol=0.02)
    assert 0 < run.pct_peak <= 100 and run.peak_tflops == 16.0 * len(run.pes)
    assert run.hbm_bytes % die.burst_bytes("hbm") == 0 and run.hbm_bytes > 0


def test_buffers_of_pes_sharing_a_memory_do_not_overlap(die):
    from kbtorch.kernel import build
    seen = []
    build(lambda ctx: seen.append(ctx.hbm("x", 1000)), range(8), die)
    spans = sorted((b.addr, b.addr + b.nbytes) for b in seen)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))


def test_collective_on_a_shared_memory(die):
    shards = [torch.randn(2048, dtype=torch.float16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    for algo in ("ring", "direct", "tree"):
        run = all_reduce(shards, group="all", algo=algo, machine=die)
        ref = torch_reference("all_reduce", shards)
        assert all(torch.allclose(o.float(), r.float(), atol=0.05) for o, r in zip(run.outputs, ref))
        assert run.latency_ps >= run.bound_ps > 0


def test_attention_numerics(die):
    q = torch.randn(1, 4, 50, 64, dtype=torch.float16)
    k, v = torch.randn(1, 2, 50, 64, dtype=torch.float16), torch.randn(1, 2, 50, 64, dtype=torch.float16)
    run = attention(q, k, v, is_causal=True, machine=die)
    assert torch.allclose(run.out.float(), attention_reference(q, k, v, True).float(), atol=2e-2)
    assert run.latency_ns > 0 and run.op == "attention prefill"


def test_attention_costs_pages_and_control_overheads_are_the_machines(die):
    """The numbers kernels once held as constants are read from the file: change one there
    and the simulated figure follows."""
    from kbtorch.ops.attention_kernel import math_costs
    from kbtorch.ops.gemm_model import estimate
    from kbtorch.ops.gemm_plan import GemmTiling
    from kbtorch.ops.layout import page_align, tcm_align, tcm_budget
    assert math_costs(die, 0) == {"softmax": 6, "mask": 1, "merge": 2, "merge_row": 6}
    assert page_align(die, 1) == die.page_bytes == 4096 and tcm_align(die, 0, 1) == die.flit_bytes == 128
    assert tcm_budget(die, 0) == die.capacity("tcm", 0) - 4096
    assert die.control_ps(0) == 4000                   # the cpu's 3 ns and the scheduler's 1 ns
    shape = dict(shape=(1, 4, 4, 64, 256, 64), is_causal=True)
    base = attention(machine=die, **shape)
    dear = load_machine(die.path, overrides={"components.tvp.flops_per_element.attn_softmax": 60})
    assert attention(machine=dear, **shape).latency_ps > base.latency_ps
    slow = load_machine(die.path, overrides={"components.cpu.overhead_ns": 13})
    tiling = GemmTiling((2, 4, 1), (128, 64, 128))
    a, b = (estimate(m, 256, 256, 256, "f16", list(range(8)), tiling) for m in (die, slow))
    assert b.ns == pytest.approx(a.ns + 10)            # the estimate's first issue waits 10 ns more
    paged = load_machine(die.path, overrides={"machine.page_bytes": 1 << 20})
    assert tcm_budget(paged, 0) == die.capacity("tcm", 0) - (1 << 20)


def test_vector_op_cost_is_the_machines(die):
    cheap, dear = (elementwise(op, 1 << 16, inputs=1, machine=die) for op in ("add", "gelu"))
    assert dear.flops == 6 * cheap.flops and dear.latency_ps >= cheap.latency_ps
    for run in (cheap, dear):
        assert 0 < run.bound_ps <= run.latency_ps and run.analytic_ps > run.bound_ps


def test_use_selects_the_machine(die, monkeypatch):
    monkeypatch.delenv("KBTORCH_TOPOLOGY", raising=False)
    assert current_machine().name == "ahbm"
    with use(DIEWIDE) as m:
        assert current_machine() is m is as_machine(None) and m.name == "diewide"
        seen = []
        t = threading.Thread(target=lambda: seen.append(current_machine().name))
        t.start()
        t.join()
        assert seen == ["ahbm"]                      # the block's choice is its own
    assert current_machine().name == "ahbm"
    monkeypatch.setenv("KBTORCH_TOPOLOGY", DIEWIDE)
    assert current_machine().name == "diewide"


def test_every_family_has_a_bench_command(capsys):
    argv = ["bench", "attention", "--hq", "4", "--hkv", "2", "--lq", "1", "--lk", "256", "--d", "64",
            "--topology", DIEWIDE, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["family"] == "attention" and out["latency_ns"] > 0 and out["topology"] == "diewide"
    assert main(["bench", "vector", "--op", "silu", "--n", "4096", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["flops"] == 5 * 4096


def test_qwen_layer_checks_on_another_machine():
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "examples" / "qwen_layer.py"), "--config", "tiny", "--seq", "9",
                          "--check", "--json", "--topology", DIEWIDE], capture_output=True, text=True, timeout=120)
    rec = json.loads(out.stdout)
    assert out.returncode == 0 and rec["allclose"] and rec["latency_ns"] > 0


def test_pe_roles_must_name_nodes_of_the_pe_block(tmp_path):
    from kbtorch.topology import TopologyError
    text = Path(DIEWIDE).read_text().replace('gemm = "ttu"', 'gemm = "tensor_unit"')
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(TopologyError, match="machine.pe_roles.gemm: names 'tensor_unit'"):
        load_machine(str(bad))
