"""Shared fixtures: the shipped AHBM machine, the tiny test machine, topology file writing."""
from pathlib import Path

import pytest

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


@pytest.fixture
def write_topology(tmp_path):
    """A function ``write(text, name="topo.toml") -> Path`` that writes a TOML file in tmp_path."""
    def write(text: str, name: str = "topo.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path
    return write
