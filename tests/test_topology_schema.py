"""The topology schema: every bad input is a TopologyError naming the file and the entry,
refused in well under a second; the new optional fields are accepted."""
import time

import pytest

from kbtorch.topology import Machine, TopologyError, load_machine
from kbtorch.topology.load.parse import parse
from kbtorch.topology.load.pipeline import load_raw

HBM = 'hbm_slice = { kind = "hbm", overhead_ns = 0, channels = 2, channel_gbps = 128, burst_bytes = 256, capacity_gib = 1 }'
TCM = 'tcm = { kind = "tcm", overhead_ns = 0, capacity_mib = 16, scratch_mib = 1 }'
GEMM = 'gemm = { kind = "gemm", overhead_ns = 0, tflops = { f16 = 8.0, bf16 = 8.0, fp32 = 2.0 } }'
FPE = ', flops_per_element = { add = 1, mul = 1, max = 1, exp = 4, silu = 5, gelu = 8, rsqrt = 4, div = 1, cmp = 1, select = 1, round = 1, fma = 2, transcendental = 8, sqrt = 4, reduce = 1, var = 3, logsumexp = 6, sort = 16, softmax = 8, log_softmax = 9, rms_norm = 5, layer_norm = 8, attn_softmax = 8, attn_mask = 1, attn_merge = 2, attn_merge_row = 8 }'
NOC = 'noc = { kind = "noc", bw_gbps = 256, prop_ns = 0 }'
PE_ARRAY = 'arrays = { pe = { block = "pe", count = 2 } }'
CHIP_ARRAY = 'arrays = { chip = { block = "chip", count = 2,'

# case -> (edits to tiny.toml, entry, words in the message)
BAD = {
    "prop_ns inf": ([('"ucie", bw_gbps = 512, prop_ns = 8', '"ucie", bw_gbps = 512, prop_ns = inf')],
                    "links.ucie.prop_ns", "expected a finite non-negative number, got inf"),
    "prop_ns negative": ([('"ucie", bw_gbps = 512, prop_ns = 8', '"ucie", bw_gbps = 512, prop_ns = -8')],
                         "links.ucie.prop_ns", "non-negative"),
    "prop_ns huge": ([('"ucie", bw_gbps = 512, prop_ns = 8', '"ucie", bw_gbps = 512, prop_ns = 1e300')],
                     "links.ucie.prop_ns", "limited"),
    "bw_gbps inf": ([(NOC, NOC.replace("256", "inf"))], "links.noc.bw_gbps", "expected a finite positive number, got inf"),
    "bw_gbps nan": ([(NOC, NOC.replace("256", "nan"))], "links.noc.bw_gbps", "got nan"),
    "bw_gbps string": ([(NOC, NOC.replace("256", '"fast"'))], "links.noc.bw_gbps", "got 'fast'"),
    "bw_gbps bool": ([(NOC, NOC.replace("256", "true"))], "links.noc.bw_gbps", "got True"),
    "bw_gbps typo": ([(NOC, NOC.replace("bw_gbps", "bw_gpbs"))], "links.noc.bw_gpbs", "did you mean 'bw_gbps'"),
    "clock inf": ([("clock_ghz = 1.0", "clock_ghz = inf")], "machine.clock_ghz", "finite positive"),
    "clock nan": ([("clock_ghz = 1.0", "clock_ghz = nan")], "machine.clock_ghz", "finite positive"),
    "flit float": ([("flit_bytes = 256", "flit_bytes = 256.0")], "machine.flit_bytes", "positive integer"),
    "flit bool": ([("flit_bytes = 256", "flit_bytes = true")], "machine.flit_bytes", "positive integer"),
    "route_reset typo": ([("route_reset =", "route_reest =")], "machine.route_reest", "did you mean 'route_reset'"),
    "route_order not list": ([('route_order = ["x", "chip"]', 'route_order = "x"')], "machine.route_order", "list of strings"),
    "missing machine name": ([('name = "tiny"', "")], "machine", "missing field 'name'"),
    "missing page": ([("page_bytes = 4096", "")], "machine", "missing field 'page_bytes'"),
    "page float": ([("page_bytes = 4096", "page_bytes = 4096.0")], "machine.page_bytes", "positive integer"),
    "issue negative": ([("fixed_cycles = 40", "fixed_cycles = -40")], "issue.fixed_cycles", "non-negative"),
    "cap float": ([("composite_cap_bytes = 1024", "composite_cap_bytes = 1024.5")], "issue.composite_cap_bytes", "integer"),
    "unknown section": ([("[issue]", "[extra]\nx = 1\n\n[issue]")], "extra", "unknown key"),
    "capacity string": ([(HBM, HBM.replace("capacity_gib = 1", 'capacity_gib = "big"'))],
                        "components.hbm_slice.capacity_gib", "got 'big'"),
    "hbm no channel_gbps": ([(HBM, HBM.replace("channel_gbps = 128, ", ""))], "components.hbm_slice", "channel_gbps"),
    "hbm no burst_bytes": ([(HBM, HBM.replace("burst_bytes = 256, ", ""))], "components.hbm_slice", "burst_bytes"),
    "hbm no capacity": ([(HBM, HBM.replace(", capacity_gib = 1", ""))], "components.hbm_slice", "capacity_gib, capacity_mib"),
    "hbm two capacities": ([(HBM, HBM.replace("capacity_gib = 1", "capacity_gib = 1, capacity_mib = 4"))],
                           "components.hbm_slice", "exactly one"),
    "channels fraction": ([(HBM, HBM.replace("channels = 2", "channels = 2.5"))], "components.hbm_slice.channels", "integer"),
    "channels bool": ([(HBM, HBM.replace("channels = 2", "channels = true"))], "components.hbm_slice.channels", "integer"),
    "channels huge": ([(HBM, HBM.replace("channels = 2", "channels = 1000000000"))], "components.hbm_slice.channels", "4096"),
    "burst zero": ([(HBM, HBM.replace("burst_bytes = 256", "burst_bytes = 0"))], "components.hbm_slice.burst_bytes", "positive"),
    "tflops zero": ([(GEMM, GEMM.replace("f16 = 8.0", "f16 = 0"))], "components.gemm.tflops.f16", "finite positive"),
    "tflops empty": ([(GEMM, GEMM.replace("{ f16 = 8.0, bf16 = 8.0, fp32 = 2.0 }", "{}"))], "components.gemm.tflops", "empty"),
    "gemm no tflops": ([(GEMM, 'gemm = { kind = "gemm" }')], "components.gemm", "missing field 'tflops'"),
    "math no flops_per_element": ([(FPE, "")], "components.math", "flops_per_element"),
    "flops_per_element float": ([(FPE, FPE.replace("exp = 4", "exp = 4.5"))],
                                "components.math.flops_per_element.exp", "positive integer"),
    "scratch over capacity": ([(TCM, TCM.replace("scratch_mib = 1", "scratch_mib = 16"))],
                              "components.tcm.scratch_mib", "less than capacity_mib"),
    "tcm no capacity": ([(TCM, 'tcm = { kind = "tcm" }')], "components.tcm", "capacity_mib"),
    "unknown kind": ([('kind = "router"', 'kind = "ruoter"')], "components.router.kind", "did you mean 'router'"),
    "unknown kind lists known": ([('kind = "router"', 'kind = "switch"')], "components.router.kind", "known: cpu"),
    "unknown component key": ([('"ipcq", overhead_ns = 1', '"ipcq", overhead_nss = 1')],
                              "components.ipcq.overhead_nss", "did you mean 'overhead_ns'"),
    "transit not bool": ([('"router", overhead_ns = 2, transit = true', '"router", overhead_ns = 2, transit = 1')],
                         "components.router.transit", "true or false"),
    "count zero": ([(PE_ARRAY, PE_ARRAY.replace("count = 2", "count = 0"))], "blocks.cube.arrays.pe.count", "positive"),
    "count float": ([(PE_ARRAY, PE_ARRAY.replace("count = 2", "count = 2.0"))], "blocks.cube.arrays.pe.count", "integer"),
    "grid zero": ([("grid = [1, 2]", "grid = [1, 0]")], "blocks.chip.arrays.cube.grid", "positive integers"),
    "array without size": ([(PE_ARRAY, 'arrays = { pe = { block = "pe" } }')], "blocks.cube.arrays.pe", "count, grid"),
    "unknown block": ([(PE_ARRAY, PE_ARRAY.replace('block = "pe"', 'block = "pee"'))],
                      "blocks.cube.arrays.pe.block", "did you mean 'pe'"),
    "bad dir": ([('link = "noc", dir = "b->a"', 'link = "noc", dir = "up"')], "blocks.cube.links[3].dir", "one of"),
    "link typo": ([('{ a = "hc", b = "r", link = "noc" }', '{ a = "hc", b = "r", lnk = "noc" }')],
                  "blocks.cube.links[4].lnk", "did you mean 'link'"),
    "unknown link kind": ([('{ a = "hc", b = "r", link = "noc" }', '{ a = "hc", b = "r", link = "nco" }')],
                          "blocks.cube.links[4].link", "did you mean 'noc'"),
    "node name with dot": ([('nodes = { r = "router"', 'nodes = { "r.x" = "router", r = "router"')],
                           "blocks.cube.nodes.r.x", "letters, digits"),
    "duplicate node names": ([(PE_ARRAY, 'arrays = { pe = { block = "pe", count = 11 }, pe1 = { block = "pe", count = 1 } }')],
                             "blocks.cube.arrays.pe1[0]", "already used by blocks.cube.arrays.pe[10]"),
    "block contains itself": ([(PE_ARRAY, 'arrays = { pe = { block = "pe", count = 2 }, me = { block = "cube", count = 1 } }')],
                              "blocks.cube", "contains itself"),
    "too many elements": ([(CHIP_ARRAY, CHIP_ARRAY.replace("count = 2", "count = 1000000000"))],
                          "machine.top", "KBTORCH_MAX_ELEMENTS"),
    "pe_roles not names": ([('pe_block = "pe"', 'pe_block = "pe"\npe_roles = { cp = 3 }')], "machine.pe_roles.cp", "string"),
    "deep TOML nesting": ([("[issue]", "deep = " + "[" * 5000 + "]" * 5000 + "\n[issue]")], "file", "nested too deeply"),
    "malformed TOML": ([("[blocks.chip]", "[blocks.chip")], "file", "not valid TOML"),
}


def _refused(path, **kw) -> TopologyError:
    start = time.perf_counter()
    with pytest.raises(TopologyError) as info:
        load_machine(str(path), **kw)
    assert time.perf_counter() - start < 1.0
    assert "Traceback" not in str(info.value)
    return info.value


@pytest.mark.parametrize("case", list(BAD))
def test_bad_topology_is_refused(case, tiny_path, write_topology):
    edits, entry, words = BAD[case]
    text = tiny_path.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = write_topology(text)
    err = _refused(path)
    assert (err.path, err.entry) == (str(path), entry), str(err)
    assert str(err).startswith(f"{path}: {entry}: ") and words in err.message, str(err)


def test_deep_block_nesting(tiny_path, write_topology):
    text = tiny_path.read_text().replace('block = "chip", count = 2', 'block = "b0", count = 2')
    chain = "".join(f'[blocks.b{i}]\narrays = {{ a = {{ block = "b{i + 1}", count = 1 }} }}\n' for i in range(100))
    path = write_topology(text + chain + '[blocks.b100]\narrays = { a = { block = "chip", count = 1 } }\n')
    err = _refused(path)
    assert err.entry.startswith("blocks.b") and "deeper than" in err.message


@pytest.mark.parametrize("data, words", [(b"\xff\xfe[machine]\n", "not UTF-8"), (b"\x00\x01\x02", "not valid TOML")])
def test_binary_file(data, words, tmp_path):
    path = tmp_path / "bin.toml"
    path.write_bytes(data)
    err = _refused(path)
    assert (err.path, err.entry) == (str(path), "file") and words in err.message


def test_directory(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    err = _refused(tmp_path / "dir.toml")
    assert (err.path, err.entry) == (str(tmp_path / "dir.toml"), "file") and "directory" in err.message


def test_size_limit_argument_and_environment(tiny_path, monkeypatch):
    assert len(load_raw(tiny_path, max_elements=288).pes) == 8      # tiny: 84 nodes + 204 links
    with pytest.raises(TopologyError, match="limit of 287; raise it with max_elements=N or .KBTORCH_MAX_ELEMENTS"):
        load_raw(tiny_path, max_elements=287)
    monkeypatch.setenv("KBTORCH_MAX_ELEMENTS", "100")
    with pytest.raises(TopologyError, match="more than the limit of 100"):
        load_raw(tiny_path)
    monkeypatch.setenv("KBTORCH_MAX_ELEMENTS", "lots")
    with pytest.raises(TopologyError, match="KBTORCH_MAX_ELEMENTS: expected a positive integer"):
        load_raw(tiny_path)


def test_new_optional_fields_accepted(tiny_path, write_topology):
    roles = 'pe_roles = { cp = "cp", sched = "sched", dma_rd = "dma_rd", dma_wr = "dma_wr", gemm = "gemm", math = "math", tcm = "tcm", ipcq = "ipcq" }'
    path = write_topology(tiny_path.read_text().replace('pe_block = "pe"', f'pe_block = "pe"\n{roles}'))
    m = Machine(str(path))
    assert m.node(m.pes[0].node("math"))["params"]["flops_per_element"]["gelu"] == 8


def test_overrides(tiny_path, tiny):
    over = {"links.noc.bw_gbps": 512, "components.hbm_slice.capacity_gib": 8, "issue.fixed_cycles": 20}
    m = load_machine(str(tiny_path), overrides=over)
    assert m is load_machine(str(tiny_path), overrides=dict(reversed(over.items())))
    assert m is not tiny and load_machine(str(tiny_path)) is tiny
    assert m.graph.edges["chip0.cube0.hc", "chip0.cube0.r"]["flit_ps"] == 500
    assert m.node("chip0.cube0.hs0")["params"]["capacity_gib"] == 8 and m.issue.fixed_cycles == 20
    assert tiny.graph.edges["chip0.cube0.hc", "chip0.cube0.r"]["flit_ps"] == 1000
    assert Machine(str(tiny_path), overrides={"blocks.cube.links[4].link": "ucie"}).graph.edges[
        "chip0.cube0.hc", "chip0.cube0.r"]["kind"] == "ucie"


def test_parsed_once_each_copy_fresh(tiny_path):
    """A file's bytes are parsed once; each caller gets a copy of its own to change (the loader
    sets overrides in it), and the same bytes under a fault still name their file."""
    data = tiny_path.read_bytes()
    doc = parse(tiny_path, data)
    doc["links"]["noc"]["bw_gbps"] = -1
    again = parse(tiny_path, data)
    assert again is not doc and again["links"]["noc"]["bw_gbps"] != -1
    with pytest.raises(TopologyError, match="not valid TOML") as err:
        parse("elsewhere.toml", data + b"\n[[[")
    assert err.value.path == "elsewhere.toml"


@pytest.mark.parametrize("over, entry, words", [
    ({"links.noc.bw_gpbs": 1}, "links.noc.bw_gpbs", "did you mean 'bw_gbps'"),
    ({"linkz.noc.bw_gbps": 1}, "linkz.noc.bw_gbps", "did you mean 'links'"),
    ({"blocks.cube.links[99].a": "r"}, "blocks.cube.links[99].a", "list of 8"),
    ({"links.noc.bw_gbps": float("inf")}, "links.noc.bw_gbps", "set by override 'links.noc.bw_gbps'"),
    ({"components.tcm.scratch_mib": 64}, "components.tcm.scratch_mib", "less than capacity_mib"),
    ({"links..noc": 1}, "links..noc", "not a dotted path"),
    ({"links.noc": {"kind": "noc", "bw_gbps": 256}}, "links.noc", "missing field 'prop_ns'"),
])
def test_bad_overrides(over, entry, words, tiny_path):
    err = _refused(tiny_path, overrides=over)
    assert (err.path, err.entry) == (str(tiny_path), entry) and words in err.message, str(err)
