"""Maia 200 from topology files alone: the chip (kbtorch/topologies/maia200.toml) and eight chips in
two trays (maia200_x8.toml); peaks as the paper states, GEMM in bf16 and fp8 with bf16 out,
an all-gather between chips, and the kernel launch that the [launch] section models."""
import ast
from pathlib import Path

import pytest
import torch

from kbtorch.ops.collective import all_gather, torch_reference
from kbtorch.ops.gemm import gemm, reference
from kbtorch.topology.machine import Machine, topology_path
from kbtorch.topology.errors import TopologyError

ROOT = Path(__file__).resolve().parents[1]


def load_machine(name, overrides=None):
    """NOTE: uncached (Machine, not load_machine), so that these machines do not push the
    machines other tests hold out of load_machine's cache."""
    return Machine(topology_path(name), overrides)


@pytest.fixture(scope="module")
def chip():
    return load_machine("maia200")


def test_peaks_and_memories_as_the_paper_states(chip):
    assert len(chip.pes) == 36
    assert chip.peak_tflops("bf16") == pytest.approx(1180, abs=0.5)
    assert chip.peak_tflops("fp8") == pytest.approx(4719, abs=0.5)
    assert chip.hbm_gbps(range(36)) == pytest.approx(7000, rel=1e-6)
    assert chip.sharers("hbm") == tuple(range(36))                      # die-wide, bound across arrays
    assert chip.capacity("tcm", 0) == int(2.75 * 2**20) and chip.memory(35, "sram") == "cluster3.csram"
    assert chip.engine_tflops(0, "math", "fp32") == pytest.approx(1.536)


def test_enabled_tiles_are_one_override():
    ten = load_machine("maia200", overrides={"blocks.cluster.arrays.tile.count": 10})
    assert len(ten.pes) == 40 and ten.sharers("hbm") == tuple(range(40))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_gemm_numerics_bf16_out(chip, dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(96, 130, generator=g).to(dtype), torch.randn(130, 70, generator=g).to(dtype)
    run = gemm(a, b, out_dtype=torch.bfloat16, machine=chip, pes=range(9))
    assert run.c.dtype == torch.bfloat16 and run.out_dtype == "bf16"
    assert torch.allclose(run.c.float(), reference(a, b, torch.bfloat16).float(), atol=0.05, rtol=0.01)
    assert 0 < run.pct_peak <= 100


def test_fp8_runs_at_the_fp8_peak(chip):
    bf, f8 = (gemm(shape=(1024, 1024, 2048), dtype=d, out_dtype="bf16", machine=chip, pes=range(9))
              for d in ("bf16", "fp8_e4m3"))
    assert f8.peak_tflops == 4 * bf.peak_tflops and f8.latency_ps < bf.latency_ps


def test_launch_is_modeled(chip):
    assert chip.launch_ps(0) > 1_000_000                                 # 1 us at the DCP + the route
    assert chip.launch_ps(8) > chip.launch_ps(0) - 1                     # tiles further out start no earlier
    run = gemm(shape=(64, 64, 64), dtype="bf16", machine=chip, pes=range(1))
    assert run.breakdown()["launch"] == chip.launch_ps(0)
    assert 0 < load_machine("ahbm").launch_ps(0) < chip.launch_ps(0)     # AHBM: from the SIP's PCIe endpoint
    assert load_machine(str(ROOT / "tests" / "data" / "tiny.toml")).launch_ps(0) == 0   # no [launch]: t = 0


def test_launch_node_must_exist(tmp_path):
    text = (ROOT / "kbtorch" / "topologies" / "maia200.toml").read_text().replace('node = "dcp"', 'node = "nowhere"')
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TopologyError, match="no node 'nowhere'"):
        load_machine(str(path))


def test_allgather_on_eight_chips():
    x8 = load_machine("maia200_x8")
    assert len(x8.pes) == 8
    shards = [torch.randn(512, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    for algo in ("direct", "ring"):
        run = all_gather(shards, group="all", algo=algo, machine=x8)
        assert all(torch.equal(o, r) for o, r in zip(run.outputs, torch_reference("all_gather", shards)))
        assert run.latency_ns > 4000                                     # through the switched part


def _docstrings(tree) -> set:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def test_no_code_names_maia():
    """No name, string or branch of the code names the machine (docstrings may cite the paper)."""
    hits = []
    for path in (ROOT / "kbtorch").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for n in ast.walk(tree):
            text = (n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                    else getattr(n, "id", None) or getattr(n, "attr", None) or getattr(n, "name", None))
            if isinstance(text, str) and "maia" in text.lower():
                hits.append(f"{path.relative_to(ROOT)}:{n.lineno}")
    assert not hits
