"""Shared fixtures: the shipped AHBM machine, the tiny test machine, topology file writing."""
import json
from pathlib import Path

import pytest

from kbtorch.cli import main
from kbtorch.topology import load_machine

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def tiny_path() -> Path:
    """Path of tests/data/tiny.toml (2 chips x 2 cubes x 2 PEs = 8 PEs)."""
    return DATA / "tiny.toml"


@pytest.fixture(scope="session")
def ahbm():
    """The shipped AHBM machine (256 PEs), compiled once per session."""
    return load_machine("ahbm")


@pytest.fixture(scope="session")
def tiny(tiny_path):
    """The tiny test machine (8 PEs), compiled once per session."""
    return load_machine(str(tiny_path))


@pytest.fixture(autouse=True)
def _process_machine_restored():
    """Each test starts and ends with the process default machine it found: a script run
    in-process (an example's ``--topology``) calls ``kbtorch.use(...)`` for the process."""
    from kbtorch.topology import select
    before = select._PROCESS[0]
    yield
    select._PROCESS[0] = before


@pytest.fixture
def small(tiny):
    """The tiny machine as the process machine for one test, torch's generator seeded; the
    shipped AHBM machine afterwards."""
    import torch
    from kbtorch import use
    use(tiny)
    torch.manual_seed(0)
    yield tiny
    use("ahbm")


@pytest.fixture
def on_tiny_system():
    """The process machine is tests/data/tiny_system.toml (4 tinychips x 4 PEs) for one test
    (``_process_machine_restored`` puts the previous one back)."""
    from kbtorch import use
    use(str(DATA / "tiny_system.toml"))


@pytest.fixture
def write_topology(tmp_path):
    """A function ``write(text, name="topo.toml") -> Path`` that writes a TOML file in tmp_path."""
    def write(text: str, name: str = "topo.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path
    return write


@pytest.fixture
def cli_json(capsys):
    """``cli_json(*argv) -> dict``: run ``kbtorch argv --json`` in-process; it must succeed
    and print one JSON object and nothing on stderr."""
    def run(*argv) -> dict:
        assert main([*argv, "--json"]) == 0
        out, err = capsys.readouterr()
        assert err == ""
        return json.loads(out)
    return run


@pytest.fixture
def cli_error(capsys):
    """``cli_error(*argv) -> str``: run ``kbtorch argv``; it must exit 2 with a one-line
    ``kbtorch: error:`` message (returned) and no traceback."""
    def run(*argv) -> str:
        assert main(list(argv)) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("kbtorch: error: ") and "Traceback" not in err
        return err
    return run
