"""docs/extending.md held true: each recipe is followed, as written, in a temporary copy of
the project, and the tests the doc names run on the result. A recipe's code is a fenced
block whose first line is ``# file: PATH``; the copy gets exactly those files (and, for a new
machine, a chip file beside the shipped ones) and no other edit, so a recipe that needs an
undocumented edit fails here."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"```python\n# file: (\S+)\n(.*?)```", re.S)
#: the recipe files the doc must give, by section.
FILES = {"kbtorch/ops/hbm_copy.py", "kbtorch/tensor/handlers/hypot.py", "kbtorch/tensor/parallel/data_parallel.py",
         "kbtorch/ops/collective/algorithms/star.py"}


def recipes() -> dict:
    return {path: body for path, body in BLOCK.findall(DOC.read_text())}


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The project copied (sources and tests), with every recipe of the doc applied."""
    dest = tmp_path_factory.mktemp("extended")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache")
    for part in ("kbtorch", "tests"):
        shutil.copytree(ROOT / part, dest / part, ignore=ignore)
    for path, body in recipes().items():
        target = dest / path
        assert not target.exists(), f"the recipe for {path} would overwrite a file of the project"
        target.write_text(body)
    # NOTE: a new machine: a chip file among the shipped ones, named by its [machine] name.
    chip = (ROOT / "tests" / "data" / "tiny.toml").read_text().replace('name = "tiny"', 'name = "recipe_tiny"', 1)
    (dest / "kbtorch" / "topologies" / "recipe_tiny.toml").write_text(chip)
    return dest


def _run(copy: Path, *args, **env) -> str:
    """``python *args`` in the copy, importing the copy's kbtorch; its output (fails on rc != 0)."""
    environ = {**os.environ, "PYTHONPATH": str(copy), **env}
    environ.pop("KBTORCH_TOPOLOGY", None)
    done = subprocess.run([sys.executable, *args], cwd=copy, env=environ, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _pytest(copy: Path, *args, **env) -> str:
    out = _run(copy, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, **env)
    assert re.search(r"\b\d+ passed\b", out) and " failed" not in out, out[-2000:]
    return out


def test_the_doc_gives_every_recipes_files():
    assert FILES <= set(recipes()), f"docs/extending.md lacks the recipe files {sorted(FILES - set(recipes()))}"


def test_the_copy_imports_its_own_kbtorch(copy):
    assert _run(copy, "-c", "import kbtorch; print(kbtorch.__file__)").strip() == str(copy / "kbtorch" / "__init__.py")


def test_a_new_torch_op_passes_its_opinfo_samples(copy):
    out = _pytest(copy, "tests/test_opinfo.py", "-k", "hypot", "-rA")
    assert "hypot" in out


def test_a_new_op_family_conforms_and_has_a_command(copy):
    _pytest(copy, "tests/test_op_families.py", "-k", "hbm_copy")
    out = _run(copy, "-m", "kbtorch", "bench", "hbmcopy", "--nbytes", "65536", "--topology", "tests/data/tiny.toml")
    assert "hbm_copy" in out and " ns" in out


def test_a_new_machine_runs_the_conformance_table(copy):
    _pytest(copy, "tests/test_op_families.py", "-k", "conforms", KBTORCH_TEST_MACHINES="recipe_tiny")


def test_a_new_collective_algorithm_is_checked_chosen_from_and_run(copy):
    _pytest(copy, "tests/test_collective_plan.py", "-k", "star")
    out = _run(copy, "-m", "kbtorch", "bench", "allreduce", "--algo", "star", "--bytes", "65536",
               "--topology", "tests/data/tiny.toml")
    assert "star" in out and " ns" in out


def test_new_files_keep_the_layer_order(copy):
    _pytest(copy, "tests/test_imports.py")


PLAN_CHECK = """
import torch, kbtorch
from torch import nn
from kbtorch import Replicate, Shard, init_device_mesh, parallelize_module
from kbtorch.tensor.parallel.data_parallel import DataParallel
torch.manual_seed(0)
ref = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
x = torch.randn(8, 16)
with kbtorch.use("tests/data/tiny.toml"), torch.no_grad():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    model.load_state_dict(ref.state_dict())
    model.to("ahbm")
    parallelize_module(model, init_device_mesh(), DataParallel())
    assert all(p.placements == (Replicate(),) * 2 for p in model.parameters()), "weights replicated"
    seen = []
    model.register_forward_pre_hook(lambda mod, args: seen.append(args[0].placements))
    y = model(x.to("ahbm"))
    assert seen == [(Shard(0),)], seen
    assert model.parallel_plan == {"data": "weights replicated, the batch split on dim 0"}
    torch.testing.assert_close(y.cpu(), ref(x), atol=1e-5, rtol=1e-5)
print("ok")
"""


def test_a_new_parallelism_plan_runs_right(copy):
    assert _run(copy, "-c", PLAN_CHECK).strip() == "ok"
