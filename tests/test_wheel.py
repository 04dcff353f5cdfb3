"""kbtorch as an installed package: a non-editable install into a fresh venv, then runs from a
directory outside the checkout (the shipped topologies and studies by name, the model
helpers, the main example by path).

Marked ``wheel`` and run only with KBTORCH_WHEEL_TEST=1 (.ci/run's step after the tests): it
builds and installs the package (about a minute). NOTE: the fresh venv reuses the running
environment's dependencies (torch, transformers, ...) through a .pth file instead of
installing torch again (minutes): kbtorch is installed without them, then the .pth added;
kbtorch itself comes only from the wheel, and the checkout
is never on the path (no PYTHONPATH, the working directory elsewhere).
"""
import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.wheel,
              pytest.mark.skipif(os.environ.get("KBTORCH_WHEEL_TEST") != "1",
                                 reason="installs a wheel into a fresh venv: set KBTORCH_WHEEL_TEST=1 (.ci/run does)")]

CHECK = """
import json, kbtorch, kbtorch.models.qwen2, kbtorch.models.qwen2_sweep
from kbtorch.sweep.spec import STUDY_DIR, load_spec
from kbtorch.topology.machine import load_machine
from kbtorch.topology.load.sources import TOPOLOGY_DIR
print(json.dumps({"kbtorch": kbtorch.__file__, "pes": len(load_machine("maia200").pes),
                  "topologies": sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml")),
                  "studies": {p.stem: len(load_spec(p.stem).points) for p in sorted(STUDY_DIR.glob("*.toml"))}}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with kbtorch installed from a copy of the package's sources -> (python, run dir)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    # NOTE: a copy, so that the build's egg-info and build/ never land in the checkout.
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "kbtorch", src / "kbtorch", ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([python, "-m", "pip", "install", "--no-input", "-q", "--no-deps", str(src)], check=True, env=_env())
    # NOTE: written after the install, so that pip never sees the parent's own kbtorch (an
    # editable install in CI's .venv); the venv's site-packages stays first on the path.
    Path(purelib, "_deps_from_parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run_dir = base / "elsewhere"
    run_dir.mkdir()
    return python, run_dir


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KBTORCH_TOPOLOGIES")}


def _run(installed, *argv, program="python", timeout=300) -> subprocess.CompletedProcess:
    python, run_dir = installed
    out = subprocess.run([str(python.parent / program), *argv], cwd=run_dir, env=_env(), capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_the_package_data_and_model_helpers_come_from_the_wheel(installed):
    python, _ = installed
    rec = json.loads(_run(installed, "-c", CHECK).stdout)
    assert rec["kbtorch"].startswith(str(python.parents[1])) and "site-packages" in rec["kbtorch"]
    assert {"ahbm", "maia200", "maia200_x8"} <= set(rec["topologies"]) and rec["pes"] == 36
    assert set(rec["studies"]) == {p.stem for p in (ROOT / "kbtorch" / "studies").glob("*.toml")}
    assert all(n > 0 for n in rec["studies"].values())


def test_the_cli_finds_a_shipped_topology_by_name(installed):
    rec = json.loads(_run(installed, "topo", "maia200", "--json", program="kbtorch").stdout)
    assert rec["pes"] == 36 and "site-packages" in rec["path"]


def test_the_main_example_runs_from_outside_the_checkout(installed):
    out = _run(installed, str(ROOT / "examples" / "qwen_layer.py"))
    assert "Qwen2 7b decoder layer, batch 1, decode, KV cache L=4096" in out.stdout
    assert "tokens/s" in out.stdout
