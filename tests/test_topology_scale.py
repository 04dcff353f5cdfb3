"""Large generated topologies: a 2-D mesh of routers loads in seconds, the size limit holds."""
import time

import pytest

from kbtorch.topology import Machine, TopologyError
from kbtorch.topology.load.pipeline import load_raw

PE_BLOCK = """
[blocks.pe]
nodes = { cp = "cpu", sched = "scheduler", dma_rd = "dma", dma_wr = "dma", gemm = "gemm", math = "math", tcm = "tcm", ipcq = "ipcq" }
links = [
  { a = "cp", b = "sched", link = "ctrl", dir = "a->b" },
  { a = "sched", b = "dma_rd", link = "ctrl", dir = "a->b" },
  { a = "sched", b = "dma_wr", link = "ctrl", dir = "a->b" },
  { a = "sched", b = "gemm", link = "ctrl", dir = "a->b" },
  { a = "sched", b = "math", link = "ctrl", dir = "a->b" },
  { a = "sched", b = "ipcq", link = "ctrl", dir = "a->b" },
  { a = "dma_rd", b = "tcm", link = "tcm", dir = "a->b" },
  { a = "tcm", b = "dma_wr", link = "tcm", dir = "a->b" },
  { a = "tcm", b = "gemm", link = "tcm" },
  { a = "tcm", b = "math", link = "tcm" },
]
"""


def mesh_topology(rows: int, cols: int, pes: int) -> str:
    """TOML text of a rows x cols mesh of tiles; a tile is a router, an HBM controller with
    one HBM slice per PE, and ``pes`` PEs whose NoC ports attach to the router."""
    return f"""
[machine]
name = "mesh{rows}x{cols}x{pes}"
flit_bytes = 256
page_bytes = 4096
clock_ghz = 1.0
top = "system"
pe_block = "pe"
route_order = ["x", "y"]

[issue]
fixed_cycles = 40
per_byte_cycles = 0.0625
composite_cap_bytes = 1024
descriptor_bytes = {{ dma = 32, compute = 32, send = 16, fetch = 32, store = 32, composite = 32, move = 16, stage = 8 }}

[links]
noc = {{ kind = "noc", bw_gbps = 256, prop_ns = 0 }}
tcm = {{ kind = "tcm", bw_gbps = 512, prop_ns = 0 }}
hbm = {{ kind = "hbm_port", bw_gbps = 256, prop_ns = 0 }}
ctrl = {{ kind = "ctrl", bw_gbps = 256, prop_ns = 0 }}

[components]
cpu = {{ kind = "cpu", overhead_ns = 2 }}
scheduler = {{ kind = "scheduler", overhead_ns = 1 }}
dma = {{ kind = "dma" }}
gemm = {{ kind = "gemm", tflops = {{ f16 = 8.0 }} }}
math = {{ kind = "math", tflops = {{ fp32 = 0.5 }}, flops_per_element = {{ add = 1 }} }}
tcm = {{ kind = "tcm", capacity_mib = 16, scratch_mib = 1 }}
ipcq = {{ kind = "ipcq", overhead_ns = 1 }}
router = {{ kind = "router", overhead_ns = 2, transit = true }}
hbm_ctrl = {{ kind = "hbm_ctrl", overhead_ns = 2, transit = true }}
hbm_slice = {{ kind = "hbm", channels = 8, channel_gbps = 32, burst_bytes = 256, capacity_gib = 6 }}
{PE_BLOCK}
[blocks.slice]
nodes = {{ hs = "hbm_slice" }}

[blocks.tile]
nodes = {{ r = "router", hc = "hbm_ctrl" }}
arrays = {{ pe = {{ block = "pe", count = {pes} }}, hs = {{ block = "slice", count = {pes} }} }}
links = [
  {{ a = "pe[*].dma_rd", b = "r", link = "noc" }},
  {{ a = "pe[*].dma_wr", b = "r", link = "noc" }},
  {{ a = "pe[*].ipcq", b = "r", link = "noc" }},
  {{ a = "pe[*].cp", b = "r", link = "noc", dir = "b->a" }},
  {{ a = "hc", b = "r", link = "noc" }},
  {{ a = "hs[*].hs", b = "hc", link = "hbm" }},
]
bind = [{{ array = "pe", attr = "hbm", nodes = [{", ".join(f'"hs[{i}].hs"' for i in range(pes))}] }}]

[blocks.system]
arrays = {{ tile = {{ block = "tile", grid = [{rows}, {cols}], dims = ["y", "x"], connect = [
  {{ dim = "x", a = "r", b = "r", link = "noc" }},
  {{ dim = "y", a = "r", b = "r", link = "noc" }},
] }} }}
"""


def test_2000_pe_mesh_loads_in_seconds(write_topology):
    path = write_topology(mesh_topology(10, 25, 8))
    start = time.perf_counter()
    m = Machine(str(path))
    elapsed = time.perf_counter() - start
    assert len(m.pes) == 2000
    assert elapsed < 10, f"loading 2000 PEs took {elapsed:.1f} s"
    route = m.route(m.pes[0].node("dma_wr"), m.pes[-1].node("dma_rd"))
    assert [m.graph.edges[u, v]["dim"] for u, v in zip(route, route[1:]) if m.graph.edges[u, v]["dim"]] == ["x"] * 24 + ["y"] * 9


def test_huge_mesh_refused_before_expanding(write_topology):
    path = write_topology(mesh_topology(1000, 1000, 8))     # 8 million PEs
    start = time.perf_counter()
    with pytest.raises(TopologyError, match=r"expands to \d+ elements .* more than the limit of 500000"):
        load_raw(path)
    assert time.perf_counter() - start < 1.0
    small = load_raw(write_topology(mesh_topology(2, 2, 2), "small.toml"), max_elements=264)
    assert len(small.nodes) + len(small.edges) == 264      # the count before expanding is exact here
