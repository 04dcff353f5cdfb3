"""Topology files: loading, the compiled graph, PE numbering, routing, issue cost, bad input."""
import networkx as nx
import pytest

from kbtorch.topology import Machine, TopologyError, load_machine

CHIP_RULE = '  { dim = "chip", a = "ep_e", b = "ep_w", link = "pcie", wrap = true },\n'
ORDER = 'route_order = ["x", "chip"]'
RESET = 'route_reset = ["chip"]'


@pytest.fixture(scope="module")
def ahbm_torus():
    return load_machine("ahbm_torus")


def pe_route(m, src: int, dst: int) -> tuple:
    """Route from PE src's DMA write port to PE dst's DMA read port."""
    return m.route(m.pes[src].node("dma_wr"), m.pes[dst].node("dma_rd"))


def hops(m, route) -> list:
    """Edge attribute dicts along a route."""
    return [m.graph.edges[u, v] for u, v in zip(route, route[1:])]


def dims(m, route) -> list:
    """The dimensions of the hops of a route that carry one (connect-rule links)."""
    return [e["dim"] for e in hops(m, route) if e["dim"] is not None]


def ahbm_pe(sip: int, y: int, x: int, pe: int = 0) -> int:
    """AHBM PE id of PE `pe` in the CUBE at row y, column x of SIP `sip`."""
    return sip * 128 + (y * 4 + x) * 8 + pe


@pytest.mark.parametrize("name, pes", [("ahbm", 256), ("ahbm_torus", 256), ("torus6", 48)])
def test_shipped_topologies_load(name, pes):
    m = load_machine(name)
    assert m.name == name
    assert len(m.pes) == pes


def test_tiny_loads(tiny):
    assert tiny.name == "tiny"
    assert len(tiny.pes) == 8
    assert [pe.hbm for pe in tiny.pes[:2]] == ["chip0.cube0.hs0", "chip0.cube0.hs1"]


def test_graph_is_frozen(tiny):
    assert isinstance(tiny.graph, nx.DiGraph)
    assert nx.is_frozen(tiny.graph)
    with pytest.raises(nx.NetworkXError):
        tiny.graph.add_node("extra")
    with pytest.raises(nx.NetworkXError):
        tiny.graph.add_edge("chip0.cube0.r", "chip1.cube1.r")


def test_edge_and_node_attributes(ahbm):
    for _, _, e in ahbm.graph.edges(data=True):
        assert {"bw_gbps", "prop_ns", "flit_ps", "prop_ps", "kind"} <= e.keys()
    for _, d in ahbm.graph.nodes(data=True):
        assert {"kind", "overhead_ps", "transit"} <= d.keys()
    pcie = next(e for _, _, e in ahbm.graph.edges(data=True) if e["kind"] == "pcie")
    assert (pcie["bw_gbps"], pcie["prop_ns"], pcie["flit_ps"], pcie["prop_ps"]) == (768, 50, 333, 50_000)
    assert ahbm.graph.edges["sip0.cube0.r0", "sip0.cube0.r1"]["flit_ps"] == 1000
    assert ahbm.node("sip0.cube0.r0")["overhead_ps"] == 2000


def test_summary(ahbm):
    s = ahbm.summary()
    assert s["pes"] == 256
    assert s["peak_tflops"] == {"f16": 2048, "bf16": 2048, "fp32": 512}
    assert s["hbm_gbps_total"] == 32 * 1024
    assert s["hbm_channels"] == 2048


def test_pe_numbering(ahbm):
    assert ahbm.pes[0].node("tcm") == "sip0.cube0.pe0.tcm"
    assert ahbm.pes[9].node("tcm") == "sip0.cube1.pe1.tcm"
    assert ahbm.pes[128].node("tcm") == "sip1.cube0.pe0.tcm"
    assert ahbm.pes[9].coords == {"sip": 0, "y": 0, "x": 1, "pe": 1}
    assert ahbm.pes[9].hbm == "sip0.cube1.hs1"


@pytest.mark.parametrize("src, dst", [((0, 0), (3, 3)), ((3, 0), (0, 3)), ((1, 2), (3, 0))])
def test_xy_order_on_mesh(ahbm, src, dst):
    route = pe_route(ahbm, ahbm_pe(0, *src), ahbm_pe(0, *dst, pe=5))
    nx_, ny = abs(dst[1] - src[1]), abs(dst[0] - src[0])
    assert dims(ahbm, route) == ["x"] * nx_ + ["y"] * ny
    assert all(e["kind"] == "ucie" for e in hops(ahbm, route) if e["dim"])


def test_crossing_sips_uses_pcie(ahbm):
    route = pe_route(ahbm, ahbm_pe(0, 0, 0), ahbm_pe(1, 2, 1))
    kinds = [e["kind"] for e in hops(ahbm, route)]
    assert kinds.count("pcie") == 1
    d = dims(ahbm, route)
    i = d.index("sip")
    for part in (d[:i], d[i + 1:]):
        assert part == ["x"] * part.count("x") + ["y"] * part.count("y")


def test_torus_takes_wrap_link(ahbm, ahbm_torus):
    def ucie_hops(m):
        return sum(e["kind"] == "ucie" for e in hops(m, pe_route(m, ahbm_pe(0, 1, 0), ahbm_pe(0, 1, 3))))
    assert ucie_hops(ahbm) == 3
    assert ucie_hops(ahbm_torus) == 1


def test_torus6_wraps_both_dimensions():
    m = load_machine("torus6")
    route = pe_route(m, 0, 47)          # device (0,0) -> device (1,2): one x wrap, one y hop
    assert dims(m, route) == ["x", "y"]
    assert m.graph.has_edge("device3.phy_s", "device0.phy_n")   # y wrap: a second link between rows


@pytest.mark.parametrize("src, dst", [(0, 255), (17, 130), (200, 3), (64, 65)])
def test_routes_pass_only_through_transit_nodes(ahbm, src, dst):
    route = pe_route(ahbm, src, dst)
    assert all(ahbm.node(n)["transit"] for n in route[1:-1])
    assert route[0] == ahbm.pes[src].node("dma_wr") and route[-1] == ahbm.pes[dst].node("dma_rd")


def test_routes_are_deterministic(tiny, tiny_path):
    fresh = Machine(str(tiny_path))
    pairs = [(a, b) for a in range(8) for b in range(8) if a != b]
    assert [pe_route(tiny, a, b) for a, b in pairs] == [pe_route(fresh, a, b) for a, b in pairs]
    assert pe_route(tiny, 0, 4) == pe_route(tiny, 0, 4)


def test_issue_cost(ahbm):
    assert ahbm.issue.cmd_ps(48) == 43_000
    assert ahbm.issue.cmd_ps(0) == 40_000


BAD = {
    "unknown node": ([('{ a = "hc", b = "r", link', '{ a = "hc", b = "r9", link')],
                     "blocks.cube.links[4]", "r9"),
    "zero bandwidth": ([('kind = "noc", bw_gbps = 256', 'kind = "noc", bw_gbps = 0')],
                       "links.noc.bw_gbps", "positive"),
    "negative bandwidth": ([('kind = "ucie", bw_gbps = 512', 'kind = "ucie", bw_gbps = -512')],
                           "links.ucie.bw_gbps", "positive"),
    "missing prop_ns": ([('bw_gbps = 512, prop_ns = 8 }', 'bw_gbps = 512 }')], "links.ucie", "prop_ns"),
    "disconnected PE": ([('a = "pe[*].', 'a = "pe[0].')], "route", "pe1.dma_rd"),
    "route_order omits x": ([(ORDER, 'route_order = ["chip"]')], "route", "cannot reach"),
    "two halves": ([(CHIP_RULE, ""), (ORDER, 'route_order = ["x"]'), (RESET, "route_reset = []")],
                   "route", "cannot reach 'chip1."),
    "unknown component": ([('r = "router"', 'r = "switch"')], "blocks.cube.nodes.r", "switch"),
    # loaded, then failed in the GEMM kernel with a bare KeyError
    "PE without its GEMM link": ([('  { a = "tcm", b = "gemm", link = "tcm" },\n', "")], "blocks.pe.links",
                                 "PE 0 has no link tcm -> gemm, gemm -> tcm"),
    "PE without its DMA read link": ([('  { a = "dma_rd", b = "tcm", link = "tcm", dir = "a->b" },\n', "")],
                                     "blocks.pe.links", "no link dma_rd -> tcm"),
    "malformed TOML": ([("[blocks.chip]", "[blocks.chip")], "file", "not valid TOML"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_topology(case, tiny_path, write_topology):
    edits, entry, words = BAD[case]
    text = tiny_path.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = write_topology(text)
    with pytest.raises(TopologyError) as info:
        load_machine(str(path))
    assert info.value.path == str(path) and info.value.entry == entry
    assert str(path) in str(info.value) and entry in str(info.value) and words in str(info.value)


def test_unknown_topology_name():
    with pytest.raises(TopologyError) as info:
        load_machine("no_such_machine")
    assert info.value.entry == "name"
    assert "no_such_machine" in str(info.value) and "ahbm" in str(info.value)


def test_missing_topology_file(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(TopologyError, match="no such topology file") as info:
        load_machine(str(path))
    assert str(path) in str(info.value)
