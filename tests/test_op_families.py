"""The conformance table of op families, as OpInfo is for torch ops: every registered family
x the tiny and diewide test machines, from the data on its registration (``OpFamily.samples``,
``bad``, ``tolerance``, ``numeric``, ``atol``): numerics against its torch reference, the bound
never beaten, the analytic estimate within the family's stated tolerance of the simulation,
bad params refused by name. Families are discovered (``ops.load_families`` imports every
module of kbtorch/ops), so a new family is in this table the moment its file registers it."""
import os
import sys
from pathlib import Path

import pytest
import torch

from kbtorch import ops
from kbtorch.ops import contract
from kbtorch.topology import load_machine

DATA = Path(__file__).resolve().parent / "data"
#: the machines of the table: the test machines, or those of $KBTORCH_TEST_MACHINES (names
#: or paths, comma-separated: docs/extending.md, "A new machine").
MACHINES = tuple(m for m in os.environ.get("KBTORCH_TEST_MACHINES", "tiny,diewide").split(",") if m)
ops.load_families()


def _machine(name: str):
    return load_machine(str(DATA / f"{name}.toml") if (DATA / f"{name}.toml").is_file() else name)


@pytest.fixture(scope="module")
def machines():
    return {name: _machine(name) for name in MACHINES}


def _run(fam, machine, sample, where):
    """The sample's run (with data and its numerics checked, if the family computes any)."""
    if fam.numeric is None:
        return fam(machine=machine, **sample.params)
    run, got, want = fam.numeric(machine=machine, **sample.params)
    torch.testing.assert_close(got, want, atol=fam.atol, rtol=fam.atol, msg=lambda m: f"{where}: {m}")
    return run


@pytest.mark.parametrize("machine_name", MACHINES)
@pytest.mark.parametrize("fam", contract.families(), ids=lambda f: f.name)
def test_family_conforms(fam, machine_name, machines):
    machine = machines[machine_name]
    assert fam.samples and fam.bad, f"{fam.name}: declare good samples and bad ones (OpFamily.samples, .bad)"
    beaten = []
    for i, sample in enumerate(fam.samples):
        where = f"{fam.name} {sample.params} on {machine_name}"
        run = _run(fam, machine, sample, where)
        if i == 0 and fam.numeric is not None:      # the timing-only run simulates the same
            assert fam(machine=machine, **sample.params).latency_ps == run.latency_ps, where
        assert run.bound_ps is not None and run.bound_ps > 0, f"{where}: no lower bound"
        if run.latency_ps < run.bound_ps:
            beaten.append(f"{where}: {run.latency_ps} ps < bound {run.bound_ps} ps")
        assert (run.analytic_ps is None) == (fam.tolerance is None), f"{where}: an estimate states its tolerance"
        if run.analytic_ps is not None:
            error, tolerance = (run.analytic_ps - run.latency_ps) / run.latency_ps, fam.tolerance
            assert abs(error) <= tolerance, f"{where}: estimate {error:+.1%} of the simulation"
    assert not beaten, "\n".join(beaten)
    for sample in fam.bad:
        with pytest.raises(ValueError) as exc:
            fam(machine=machine, **sample.params)
        assert sample.refused.lower() in str(exc.value).lower(), (sample.params, str(exc.value))


def test_every_shipped_family_is_in_the_table():
    names = {f.name for f in contract.families()}
    assert {"gemm", "attention", "vector", "all_reduce", "reduce_scatter", "all_gather", "broadcast"} <= names


def test_a_new_family_file_is_discovered(tmp_path, monkeypatch):
    """A module dropped beside the op families registers its family with no edit elsewhere."""
    (tmp_path / "twice.py").write_text(
        "from .contract import OpFamily, Param, Sample, register\n"
        "register(OpFamily('twice', lambda machine=None, n=1: None, lambda x: 2 * x, (Param('n', 'int'),),\n"
        "                  samples=(Sample({'n': 1}),), bad=(Sample({'n': 0}, 'n'),)))\n")
    monkeypatch.setattr(ops, "__path__", [*ops.__path__, str(tmp_path)])
    monkeypatch.setattr(contract, "_FAMILIES", dict(contract._FAMILIES))
    try:
        ops.load_families()
        fam = contract.family("twice")
        assert fam.reference(3) == 6 and fam.bad[0].refused == "n"
        with pytest.raises(ValueError, match="twice: n: expected a positive int, got 0"):
            fam(machine=str(DATA / "tiny.toml"), n=0)
    finally:
        sys.modules.pop("kbtorch.ops.twice", None)
