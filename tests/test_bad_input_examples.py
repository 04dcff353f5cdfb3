"""Bad input to the example scripts (examples/*.py): each is reported as the command line does
(``kbtorch.cli.run_script``): one line on stderr naming the fault, no traceback, exit 2, one
JSON object under ``--json``; refused in under a second, before any model is built or run."""
import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

from kbtorch.cli import run_script
from kbtorch.topology import select

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TINY = str(Path(__file__).parent / "data" / "tiny.toml")


def _example(name: str):
    """The module of examples/NAME.py (imported once)."""
    key = f"example_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.fixture(autouse=True)
def _machine_choice():
    saved = select._PROCESS[0]
    yield
    select._PROCESS[0] = saved


def _refused(capsys, name: str, argv: list, fault: str, kind: str | None = None, fast: bool = True) -> None:
    main = _example(name).main
    capsys.readouterr()
    t0 = time.perf_counter()
    rc = run_script(main, argv, prog=f"{name}.py")
    took = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert err.startswith(f"{name}.py: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fault in err, err
    if "--json" in argv:
        data = json.loads(out)
        assert data["error"] is True and fault in data["message"] and (kind is None or data["kind"] == kind)
    else:
        assert out == ""
    if fast:
        assert took < 1.0, took


# ---------------------------------------------------------------- hf_generate.py, every argument

HF = [
    (["--prompt-len", "0"], "argument --prompt-len: must be positive, got 0"),
    (["--prompt-len", "-5"], "argument --prompt-len: must be positive, got -5"),
    (["--prompt-len", "1000000000"], "positions exceed qwen2.5-7b's max_position_embeddings of 32768"),
    (["--prompt-len", "99999999999999999999999"], "positions exceed qwen2.5-7b's max_position_embeddings"),
    (["--prompt-len", "1e3"], "argument --prompt-len: invalid int value: '1e3'"),
    (["--new-tokens", "0"], "argument --new-tokens: must be positive, got 0"),
    (["--new-tokens", "-1"], "argument --new-tokens: must be positive, got -1"),
    (["--new-tokens", "10000000"], "--new-tokens 10000000 = 10000128 positions exceed"),
    (["--model", "tiny", "--new-tokens", "250"], "positions exceed tiny's max_position_embeddings of 256"),
    (["--batch", "0"], "argument --batch: must be positive, got 0"),
    (["--batch", "-2"], "argument --batch: must be positive, got -2"),
    (["--batch", "1000000"], "elements exceed the limit of 268435456 per run (set KBTORCH_MAX_TENSOR_ELEMENTS"),
    (["--batch", "lots"], "argument --batch: invalid int value: 'lots'"),
    (["--model", "gpt-17"], "model 'gpt-17': not a preset"),
    (["--model", ""], "model '': not a preset"),
    (["--cache", "paged"], "argument --cache: invalid choice: 'paged'"),
    (["--kernels", "cuda"], "argument --kernels: invalid choice: 'cuda'"),
    (["--fidelity", "flit"], "argument --fidelity: invalid choice: 'flit'"),
    (["--check"], "qwen2.5-7b with data (--check or without --timing-only)"),
    (["--model", "tiny", "--timing-only", "--check"], "--check needs data"),
    (["--topology", "nope"], "argument --topology: nope: name: unknown topology"),
    (["--topology", "/no/such/machine.toml"], "argument --topology: /no/such/machine.toml: file: no such topology file"),
    (["--topology", str(EXAMPLES)], "is a directory"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--ep", "0"], "argument --ep: must be positive, got 0"),
    (["--pp", "-1"], "argument --pp: must be positive, got -1"),
    (["--ep", "2", "--pp", "2"], "--ep with --pp is not supported yet"),
    (["--microbatches", "2"], "--microbatches needs --pp"),
    (["--pp", "2", "--microbatches", "3", "--batch", "2"], "argument --microbatches: between 1 and --batch (2), got 3"),
    (["--ep", "9"], "argument --ep: chip_mesh: 9 chips asked of topology 'ahbm', which has 1"),
    (["--pp", "2"], "argument --pp: 2 stages need a divisor of the 1 chip(s) of 'ahbm'"),
]


@pytest.fixture(scope="module")
def hf():
    """transformers' config classes imported once (lazily, ~3 s): the refusals are timed without it."""
    pytest.importorskip("transformers")
    for name in ("qwen2.5-7b", "tiny-qwen2"):
        _example("hf_generate").config(name)


@pytest.mark.parametrize("argv,fault", HF, ids=[" ".join(a) for a, _ in HF])
def test_hf_generate_argument(capsys, hf, argv, fault):
    _refused(capsys, "hf_generate", [*argv, "--json"], fault)


def test_hf_generate_bad_topology_variable(capsys, monkeypatch, hf):
    select._PROCESS[0] = None
    monkeypatch.setenv("KBTORCH_TOPOLOGY", "bogus")
    _refused(capsys, "hf_generate", ["--model", "tiny"], "bogus: name: unknown topology (known: ")
    _refused(capsys, "hf_generate", ["--model", "tiny"], "(from $KBTORCH_TOPOLOGY='bogus')")


def test_hf_generate_garbage_limit(capsys, monkeypatch, hf):
    monkeypatch.setenv("KBTORCH_MAX_TENSOR_ELEMENTS", "-3")
    _refused(capsys, "hf_generate", ["--json"], "$KBTORCH_MAX_TENSOR_ELEMENTS='-3' is not a positive integer")


def test_hf_generate_model_larger_than_the_machine(capsys, hf):
    """HbmFull is the right error: reported in one line, not as a traceback (the model is
    built first: not a sub-second refusal)."""
    _refused(capsys, "hf_generate", ["--model", "qwen2.5-7b", "--topology", TINY, "--prompt-len", "4",
                                     "--new-tokens", "1", "--json"], "does not fit the HBM of 'tiny'", kind="HbmFull", fast=False)


# ---------------------------------------------------------------- every other example

OTHERS = [
    ("allreduce_sweep", ["--max-bytes", "lots", "--json"], "argument --max-bytes"),
    ("gemm_tiling", ["--seq", "0"], "argument --seq: S values must be positive"),
    ("gemm_tiling", ["--tilings", "0"], "argument --tilings: must be at least 1"),
    ("matmul_latency", ["--m", "0", "--json"], "argument --m: must be positive, got 0"),
    ("matmul_latency", ["--m", "100000", "--n", "100000", "--k", "100000", "--json"],
     "A of 100000x100000 @ 100000x100000 with data (--timing-only runs any size): 10000000000 elements exceed"),
    ("mlp_block", ["--tokens", "-1", "--json"], "argument --tokens: must be positive, got -1"),
    ("mlp_block", ["--hidden", "100000", "--intermediate", "100000", "--json"], "elements exceed the limit"),
    ("qwen_layer", ["--batch", "0", "--json"], "--batch must be positive, got 0"),
    ("qwen_layer", ["--topology", "nope", "--json"], "unknown topology"),
    ("transfer_sweep", ["--topologies", "nope"], "nope: name: unknown topology"),
    ("serve_capacity", ["--plans", "tp8,tp3", "--json"], "argument --plans: unknown plan(s) tp3"),
    ("serve_capacity", ["--requests", "0", "--json"], "argument --requests: 0 (give at least 1)"),
]


@pytest.mark.parametrize("name,argv,fault", OTHERS, ids=[f"{n} {' '.join(a)}" for n, a, _ in OTHERS])
def test_example_bad_argument(capsys, name, argv, fault):
    _refused(capsys, name, argv, fault)


def test_serve_capacity_refuses_a_step_cache_it_would_overwrite(capsys):
    pytest.importorskip("transformers")
    readme = str(EXAMPLES.parent / "README.md")
    _refused(capsys, "serve_capacity", ["--step-cache", readme, "--json"], "not an SQLite file", fast=False)


@pytest.mark.parametrize("name", sorted(p.stem for p in EXAMPLES.glob("*.py")))
def test_every_example_refuses_a_garbage_limit(capsys, monkeypatch, name):
    if name == "hf_generate":
        pytest.importorskip("transformers")
    monkeypatch.setenv("KBTORCH_MAX_TILES", "abc")
    argv = ["--json"] if "--json" in (EXAMPLES / f"{name}.py").read_text() else []
    _refused(capsys, name, argv, "$KBTORCH_MAX_TILES='abc' is not a positive integer")


def test_every_example_reports_through_run_script():
    for path in EXAMPLES.glob("*.py"):
        text = path.read_text()
        assert 'if __name__ == "__main__":\n    sys.exit(run_script(main))' in text, path.name
        assert "argparse.ArgumentParser(" not in text, path.name
