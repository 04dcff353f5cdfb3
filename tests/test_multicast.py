"""Multicast as hardware: one payload down the tree of the unicast routes, each tree link
carrying it once in every mode; arrival at every destination; the machine's declaration
(a clear error, or the named unicast fallback, where it has none); shared GEMM operands."""
import pytest
import torch

from kbtorch.kernel.api import build, launch
from kbtorch.ops.gemm import gemm, reference
from kbtorch.ops.gemm_model import multicast_parts
from kbtorch.ops.gemm_plan import GemmTiling
from kbtorch.sim.components.dma import data_path
from kbtorch.sim.multicast import MulticastError, tree
from kbtorch.sim.simulator import Simulator
from kbtorch.topology import TopologyError, load_machine

NBYTES = 40_000                      # 157 flits: a partial last flit
FLITS = -(-NBYTES // 256)
#: one PE in each cluster and two in cluster 0: the tree splits at the Global NoC and at a
#: Cluster NoC router
DESTS = (0, 1, 9, 18, 27)
NO_MULTICAST = {f"components.{c}.multicast": False for c in ("stop", "cnoc", "gnoc")}


@pytest.fixture(scope="module")
def maia():
    return load_machine("maia200")


def fan_out(ctx, dests, fallback=False):
    """The last PE of the group multicasts from its HBM into every PE's TCM buffer ``in``;
    every receiver then writes it back to HBM once notified (so each must get it)."""
    ctx.tcm("in", NBYTES)
    ctx.hbm("out", NBYTES)
    if ctx.pe != ctx.group[-1]:
        ctx.dma_write(ctx.buffer("in"), ctx.buffer("out"), NBYTES, wait="got")
        return
    src = ctx.hbm("src", NBYTES)
    ctx.multicast(src, [ctx.remote(p, "in") for p in dests], NBYTES, fallback=fallback,
                  notify=[(p, "got") for p in dests if p != ctx.pe])
    ctx.dma_write(ctx.buffer("in"), ctx.buffer("out"), NBYTES)


def run(machine, mode, fallback=False):
    sim = Simulator(machine, mode)
    result = sim.run(build(fan_out, DESTS, machine, DESTS, fallback))
    return result, {link.key: link.flits for link in sim.network.links()}


@pytest.mark.parametrize("mode", ["fast", "flit", "coarse"])
def test_each_tree_link_carries_the_payload_exactly_once(maia, mode):
    result, flits = run(maia, mode)
    src = maia.pes[DESTS[-1]].hbm
    root = tree([data_path(maia, src, maia.pes[p].node("tcm")) for p in DESTS])
    edges = set(root.edges())
    assert set(root.splits()) == {"cluster0.cnoc", "gnoc"}
    for e in edges:
        assert flits[e] == FLITS, e
    # the Global NoC -> cluster links: one copy per cluster, not one per destination
    assert sum(flits[e] for e in edges if e[0] == "gnoc") == 4 * FLITS
    hbm_out = [e for e in flits if e[0] == src]
    assert [flits[e] for e in hbm_out] == [FLITS]
    assert result.stats["memories"][src]["bursts"] == FLITS + len(DESTS) * FLITS   # read once + write-backs


def test_data_arrives_at_every_destination_and_modes_agree(maia):
    fast, _ = run(maia, "fast")
    flit, _ = run(maia, "flit")
    # every receiver ran its write-back (each was notified of its own copy)
    assert set(fast.pe_finish_ps) == set(DESTS)
    assert fast.latency_ps == flit.latency_ps
    assert abs(fast.latency_ps - run(maia, "coarse")[0].latency_ps) / fast.latency_ps < 0.05


def test_multicast_to_one_destination_is_a_dma(maia):
    def one(ctx, how):
        dst = ctx.tcm("in", NBYTES)
        src = ctx.hbm("src", NBYTES)
        (ctx.multicast(src, [dst], NBYTES) if how == "multicast" else ctx.dma_read(src, dst, NBYTES))
    times = [launch(one, [5], maia, how).latency_ps for how in ("multicast", "dma")]
    assert times[0] == times[1]


def test_trace_shows_a_done_at_every_destination_and_is_deterministic(maia):
    traces = []
    for _ in range(2):
        sim = Simulator(maia, "fast", trace=True)
        sim.run(build(fan_out, DESTS, maia, DESTS))
        traces.append(sim.engine.trace_lines())
    assert traces[0] == traces[1]
    done = [line for line in traces[0] if "\tdone\tmulticast" in line]
    for p in DESTS:
        assert any(maia.pes[p].node("tcm") in line for line in done), p


def test_machine_without_multicast_gets_a_clear_error_or_the_named_fallback(maia):
    plain = load_machine("maia200", overrides=NO_MULTICAST)
    with pytest.raises(MulticastError, match=r"split at '(gnoc|cluster\d\.cnoc)'.*no multicast"):
        build(fan_out, DESTS, plain, DESTS)
    programs = build(fan_out, DESTS, plain, DESTS, True)
    assert any("(unicast fallback)" in c.describe() for c in programs[DESTS[-1]])
    result, flits = run(plain, "fast", fallback=True)
    # one copy per destination: the memory port carries all five
    src = plain.pes[DESTS[-1]].hbm
    assert sum(n for e, n in flits.items() if e[0] == src) == len(DESTS) * FLITS
    assert result.latency_ps > run(maia, "fast")[0].latency_ps


def test_ahbm_has_no_multicast(ahbm):
    assert not ahbm.multicast_nodes
    with pytest.raises(MulticastError, match="no multicast on topology 'ahbm'"):
        build(fan_out, (0, 1, 2), ahbm, (0, 1, 2))


def test_bad_multicasts_are_refused_by_name(maia):
    def dup(ctx):
        buf = ctx.tcm("in", 256)
        ctx.multicast(ctx.hbm("src", 256), [buf, buf], 256)
    with pytest.raises(MulticastError, match="named twice"):
        build(dup, [0], maia)

    def empty(ctx):
        ctx.multicast(ctx.hbm("src", 256), [], 256)
    with pytest.raises(ValueError, match="non-empty list"):
        build(empty, [0], maia)


def test_multicast_needs_a_transit_node(write_topology, tiny_path):
    text = tiny_path.read_text().replace('tcm = { kind = "tcm", overhead_ns = 0,', 'tcm = { kind = "tcm", multicast = true, overhead_ns = 0,')
    with pytest.raises(TopologyError, match="multicast = true needs transit = true"):
        load_machine(str(write_topology(text)))


def test_gemm_shares_operands_by_multicast_with_the_same_numerics(maia):
    torch.manual_seed(0)
    a, b = torch.randn(384, 256, dtype=torch.bfloat16), torch.randn(256, 512, dtype=torch.bfloat16)
    tiling = GemmTiling((3, 4, 1), (64, 64, 128))
    plain = load_machine("maia200", overrides=NO_MULTICAST)
    shared, unicast = gemm(a, b, tiling=tiling, machine=maia), gemm(a, b, tiling=tiling, machine=plain)
    assert torch.equal(shared.c, unicast.c)
    torch.testing.assert_close(shared.c, reference(a, b), rtol=2e-2, atol=2e-1)
    hbm = lambda r: sum(s["bursts"] for s in r.result.stats["memories"].values())
    # A is read once per grid row instead of once per PE of it, B once per grid column
    assert hbm(shared) < 0.5 * hbm(unicast)
    assert shared.latency_ps < unicast.latency_ps


def multicast_tiny(write_topology, tiny_path):
    text = tiny_path.read_text()
    for comp in ("router", "hbm_ctrl", "pcie_ep"):
        text = text.replace(f'{comp} = {{ kind = "{comp}",', f'{comp} = {{ kind = "{comp}", multicast = true,')
    return load_machine(str(write_topology(text)))


@pytest.mark.parametrize("kind", ["all_gather", "broadcast"])
def test_direct_collective_copies_go_as_one_multicast(write_topology, tiny_path, tiny, kind):
    from kbtorch.ops.collective import collective, torch_reference
    from kbtorch.ops.collective.groups import make_grid, resolve_group
    m = multicast_tiny(write_topology, tiny_path)
    assert m.multicast_nodes
    torch.manual_seed(2)
    shards = [torch.randn(2048) for _ in range(8)]
    runs = {name: collective(kind, [s.clone() for s in shards], algo="direct", machine=mach, mode="fast")
            for name, mach in (("multicast", m), ("unicast", tiny))}
    for r in runs.values():
        for got, want in zip(r.outputs, torch_reference(kind, shards)):
            torch.testing.assert_close(got, want)
    links = {name: sum(s["flits"] for s in r.result.stats["links"].values()) for name, r in runs.items()}
    assert links["multicast"] < 0.8 * links["unicast"]
    assert runs["multicast"].analytic_ps < runs["unicast"].analytic_ps


def test_a_gang_across_chips_shares_inside_each_chip():
    """Multicast stops at a chip's edge: the A gang of a column-parallel GEMM over
    maia200_x8's 288 PEs is cut into its 8 chips, so each chip reads A from its HBM once
    (not once per tile), and the identical chips are still simulated once."""
    x8 = load_machine("maia200_x8")
    m, n, k = 16, 1152, 2048
    run = gemm(shape=(m, n, k), dtype="bf16", machine=x8, slices="n")
    chips = [tuple(range(c * 36, (c + 1) * 36)) for c in range(8)]
    assert multicast_parts(x8, tuple(range(288))) == tuple(chips)
    read = sum(s["bursts"] for s in run.result.stats["memories"].values()) * 256
    once_per_chip = 8 * m * k * 2 + k * n * 2 + m * n * 2
    assert once_per_chip <= read < once_per_chip + 288 * 2 * 256       # each PE's partial bursts at most
    assert run.result.stats["represented_units"] == 8
