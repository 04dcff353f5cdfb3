"""Every field of a topology or system file is used or refused, every CLI flag honoured or
refused (issue 45 items 4, 6, 7): each case names the field or argument at fault."""
import json
import time
from pathlib import Path

import pytest
import torch

import kbtorch
from kbtorch.cli import main, wants_json
from kbtorch.topology import TopologyError, load_machine

DATA = Path(__file__).parent / "data"
SYSTEM, CHIP = str(DATA / "tiny_system.toml"), str(DATA / "tiny.toml")


@pytest.mark.parametrize("overrides, field, fault", [
    ({"routing.policy": "port-spray", "routing.port_kind": "gemm"}, "routing.port_kind", "'gemm' is not a network port"),
    ({"routing.policy": "port-spray", "routing.port_kind": "hbm"}, "routing.port_kind", "'hbm' is not a network port"),
    ({"routing.relays": 1}, "routing.relays", "needs a spraying policy"),
    ({"routing.relays": 2, "routing.policy": "minimal-spray"}, "routing.relays", "at most one other chip"),
])
def test_a_system_field_that_would_be_ignored_is_refused(overrides, field, fault):
    with pytest.raises(TopologyError, match=f"{field}: .*{fault}"):
        load_machine(SYSTEM, overrides=overrides)


def test_a_link_kind_named_as_a_derived_kind_is_refused(tmp_path):
    text = Path(SYSTEM).read_text().replace("[links]\n", '[links]\nlane__x2 = { kind = "eth", bw_gbps = 1, prop_ns = 100 }\n')
    (tmp_path / "tinychip.toml").write_text((DATA / "tinychip.toml").read_text())
    (tmp_path / "s.toml").write_text(text)
    with pytest.raises(TopologyError, match="links.lane__x2: 'lane__x2' is the name of a derived kind"):
        load_machine(str(tmp_path / "s.toml"))


def test_relays_on_one_chip_are_refused(tmp_path):
    (tmp_path / "c.toml").write_text(Path(CHIP).read_text() + '\n[routing]\npolicy = "minimal-spray"\nrelays = 1\n')
    with pytest.raises(TopologyError, match="routing.relays: 1: relay chips exist only on a system"):
        load_machine(str(tmp_path / "c.toml"))


def test_the_shipped_spraying_machines_still_load():
    for name, policy in (("maia200_x8", "port-spray"), ("maia200_x8", "minimal-spray")):
        assert load_machine(name, overrides={"routing.policy": policy}).routing.policy == policy
    assert load_machine(SYSTEM, overrides={"routing.policy": "port-spray", "routing.relays": 1}).routing.relays == 1


def test_a_home_of_another_machine_is_refused():
    mesh = kbtorch.init_device_mesh(machine=SYSTEM)
    with kbtorch.use("ahbm"), kbtorch.home(mesh), pytest.raises(ValueError, match="mesh is of machine 'tiny_system'"):
        torch.randn(4, 4).to("ahbm")


def _json(capsys, argv, status=2) -> dict:
    assert main(argv) == status
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("extra, fault", [
    (["--trace", "t.json"], "argument --trace: a collective writes no event trace"),
    (["--packet-bytes", "1"], "argument --packet-bytes: packet_bytes=1: a packet is at least one flit"),
])
def test_a_collective_across_chips_refuses_what_it_would_ignore(capsys, tmp_path, extra, fault):
    argv = ["bench", "allreduce", "--bytes", "64KiB", "--group", "across:chip", "--topology", SYSTEM, "--json"]
    assert _json(capsys, argv + extra)["message"].startswith(fault)
    assert not (tmp_path / "t.json").exists()


def test_a_root_past_the_chips_names_root(capsys):
    got = _json(capsys, ["bench", "broadcast", "--bytes", "65536", "--group", "across:chip", "--topology", SYSTEM,
                         "--root", "9", "--json"])
    assert got["message"] == "argument --root: broadcast root 9 is not a member rank (0..3)"


def test_errors_are_json_under_an_abbreviation_of_json(capsys):
    assert wants_json(["bench", "allreduce", "--js"]) and wants_json(["--jso"]) and not wants_json(["--j", "x"])
    got = _json(capsys, ["bench", "allreduce", "--bytes", "0", "--js"])
    assert got["error"] and "argument --bytes" in got["message"]


def test_a_flit_exact_run_past_the_flit_budget_is_refused_before_any_work(capsys):
    t0 = time.perf_counter()
    got = _json(capsys, ["bench", "allreduce", "--mode", "flit", "--bytes", "1GiB", "--json"])
    assert time.perf_counter() - t0 < 10.0                   # NOTE: it ran for minutes before it was refused
    assert "a flit-exact all_reduce of 1073741824 bytes over 256 members sends at least" in got["message"]
    assert "KBTORCH_MAX_FLITS" in got["message"]


def _sweep(tmp_path, trays: str) -> str:
    spec = tmp_path / "sw.toml"
    spec.write_text(f'[sweep]\ntopology = "{SYSTEM}"\n[axes]\n"system.trays" = {trays}\n'
                    '[workloads.a]\nop = "all_reduce"\nnbytes = 4096\ngroup = "across:chip"\n')
    return str(spec)


def test_a_sweep_takes_a_collective_across_chips(tmp_path):
    from kbtorch.sweep.spec import load_spec
    spec = load_spec(_sweep(tmp_path, "[1, 2]"))
    assert [dict(p.params) for p in spec.points] == [{"nbytes": 4096, "group": "across:chip"}] * 2


def test_a_sweep_axis_that_breaks_the_system_is_named(tmp_path):
    from kbtorch.sweep.spec import SpecError, load_spec
    with pytest.raises(SpecError, match=r"sw.toml: axes.system.trays: = 4 leaves switches.t1 at fault: a switch with "
                                        "no uplink"):
        load_spec(_sweep(tmp_path, "[2, 4]"))


def test_a_sweep_names_the_chip_file_at_fault(tmp_path):
    from kbtorch.sweep.spec import SpecError, load_spec
    (tmp_path / "bad_chip.toml").write_text("not toml [[[\n")
    (tmp_path / "s.toml").write_text(Path(SYSTEM).read_text().replace('chip = "tinychip.toml"', 'chip = "bad_chip.toml"'))
    (tmp_path / "sw.toml").write_text(f'[sweep]\ntopology = "{tmp_path / "s.toml"}"\n[workloads.v]\nop = "vector"\nn = 4096\n')
    with pytest.raises(SpecError, match=f"sweep.topology: .*its file {tmp_path / 'bad_chip.toml'}: not valid TOML"):
        load_spec(str(tmp_path / "sw.toml"))
