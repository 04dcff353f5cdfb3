"""System files (kbtorch/topology/system.py, route/system.py): chips of a chip file joined by
trays and switch tiers, loaded as one machine; bad system files name the file and field."""
from pathlib import Path

import pytest

from kbtorch.ops.collective.groups import resolve_group
from kbtorch.topology import TopologyError, load_machine

DATA = Path(__file__).resolve().parent / "data"
SYSTEM = str(DATA / "tiny_system.toml")


@pytest.fixture(scope="module")
def tiny():
    return load_machine(SYSTEM)


def test_chips_are_instantiated_chip_major(tiny):
    chip = load_machine(str(DATA / "tinychip.toml"))
    assert tiny.chips == 4 and len(tiny.pes) == 4 * len(chip.pes)
    assert tiny.pes[5].prefix == "tray0.chip1.cube0.pe1." and tiny.chip_of(5) == 1
    assert tiny.pes[13].coords == {"tray": 1, "chip": 1, "y": 0, "x": 0, "pe": 1}
    assert tiny.peak_tflops("bf16") == pytest.approx(4 * chip.peak_tflops("bf16"))
    s = tiny.summary()
    assert (s["chips"], s["trays"], s["chips_per_tray"], s["switches"]) == (4, 2, 2, {"t0": 2, "t1": 1})
    assert resolve_group(tiny, "chip:3") == (12, 13, 14, 15)
    assert resolve_group(tiny, "tray:1") == tuple(range(8, 16))


def test_routes_stay_in_the_chip_or_cross_ports(tiny):
    pe = tiny.pes
    inside = tiny.route(pe[4].node("dma_wr"), pe[7].node("dma_rd"))
    assert all(n.startswith("tray0.chip1.") for n in inside)
    tray = tiny.route(pe[0].node("dma_wr"), pe[5].node("dma_rd"))
    assert ("tray0.chip0.peer", "tray0.chip1.peer") == tray[3:5]                  # the direct tray link
    far = tiny.route(pe[0].node("dma_wr"), pe[13].node("dma_rd"))
    assert far[3:8] == ("tray0.chip0.up", "t0_0", "t1_0", "t0_1", "tray1.chip1.up")
    for path in (tray, far):
        assert all(tiny.graph.has_edge(u, v) for u, v in zip(path, path[1:]))
    # aggregated lanes: one link of 2 x 64 GB/s
    assert tiny.graph.edges["tray0.chip0.peer", "tray0.chip1.peer"]["bw_gbps"] == 128


def test_tray_count_and_split_ports_are_parameters():
    m = load_machine(SYSTEM, overrides={"system.trays": 4, "switches.t1.per": 4, "ports.peer": {
        "attach": "nic", "component": "port", "lanes": 2, "link": "port", "split": True}})
    assert m.chips == 8 and len(m.pes) == 32
    assert m.graph.edges["tray3.chip0.peer1", "tray3.chip1.peer1"]["bw_gbps"] == 64
    assert m.route(m.pes[0].node("dma_wr"), m.pes[5].node("dma_rd"))[3:5] == ("tray0.chip0.peer0", "tray0.chip1.peer0")


def _fails(overrides, entry, words):
    with pytest.raises(TopologyError, match=words) as err:
        load_machine(SYSTEM, overrides=overrides)
    assert err.value.path.endswith("tiny_system.toml") and err.value.entry == entry
    return err.value


def test_unknown_chip_file():
    _fails({"system.chip": "nochip.toml"}, "system.chip", "unknown chip file 'nochip.toml'")


def test_dangling_ports():
    _fails({"tray.links": [{"a": "chip0.peer", "b": "chip1.pear", "link": "lane"}]}, "tray.links[0].b",
           "dangling port: no port group 'pear' .did you mean 'peer'")
    _fails({"tray.links": []}, "ports.peer", "dangling port: the group is joined to nothing")


def test_switch_without_uplink():
    sw = {"t0": {"component": "switch", "down": "up", "per": 1, "link": "up"}}
    _fails({"switches": sw}, "switches.t0", "a switch with no uplink: 2 switches")


def test_cycle_in_the_tiers():
    sw = {"t0": {"component": "switch", "down": "up", "per": 1, "link": "up"},
          "t1": {"component": "switch", "down": "t2", "per": 2, "link": "up", "lanes": 1},
          "t2": {"component": "switch", "down": "t1", "per": 2, "link": "up", "lanes": 1}}
    _fails({"switches": sw}, "switches.t1.down", r"cycle \(t1 -> t2 -> t1")


def test_a_switch_tier_names_a_known_link_and_component():
    """Both failed with a bare KeyError (link) or an internal block name (component)."""
    _fails({"switches.t1.link": "uplink"}, "switches.t1.link", "unknown link kind 'uplink'")
    _fails({"switches.t0.component": "swich"}, "switches.t0.component", "unknown component 'swich'.*did you mean 'switch'")


def test_schema_errors_name_the_field():
    _fails({"ports.up.lanes": 0}, "ports.up.lanes", "expected a positive integer")
    _fails({"tray.links[0].a": "chip7.peer"}, "tray.links[0].a", "a tray has chips 0..1")
    _fails({"ports.up.attach": "nowhere"}, "ports.up.attach", "no node 'nowhere' in the chip's top block")
    _fails({"switches.t1.down": "t9"}, "switches.t1.down", "neither a port group nor a switch tier")


def test_chip_overrides_of_a_system_set_its_chip_files_fields():
    from kbtorch.topology.load.pipeline import override_entry, resolve_doc
    doc = resolve_doc(SYSTEM, {"system.trays": 1, "chip.links.noc.bw_gbps": 512})
    assert doc["links"]["noc"]["bw_gbps"] == 512 and doc["system_file"]["system"]["trays"] == 1
    assert doc["system_file"]["system"]["chip_overrides"] == {"links.noc.bw_gbps": 512}
    assert override_entry(SYSTEM, "chip.links.noc.bw_gbps") == 256 and override_entry(SYSTEM, "system.trays") == 2
    m = load_machine(SYSTEM, {"chip.links.noc.bw_gbps": 512})
    assert len(m.pes) == len(load_machine(SYSTEM).pes) and m.chip is not load_machine(SYSTEM).chip
    with pytest.raises(TopologyError, match=r"tinychip.toml: links.nocc.bw_gbps: override: the file has no entry "
                       r"'nocc' .*\(set by override 'chip.links.nocc.bw_gbps'\)"):
        load_machine(SYSTEM, {"chip.links.nocc.bw_gbps": 512})
    with pytest.raises(TopologyError, match=r"tiny_system.toml: chip.links.nocc: .*of the chip file tinychip.toml"):
        override_entry(SYSTEM, "chip.links.nocc")
