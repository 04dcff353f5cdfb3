"""Graph mode's shared copies (kbtorch.tensor.graph.shared_copies): an all-gather among PEs that bind one
memory is a barrier that moves no data; where each PE owns its memory nothing changes."""
from pathlib import Path

import torch

import kbtorch
from kbtorch.ops.contract import memory_bytes
from kbtorch.tensor.graph.shared_copies import barrier, one_memory

DIEWIDE = str(Path(__file__).parent / "data" / "diewide.toml")


def _gather_then_add(x, r):
    return x.redistribute([kbtorch.Replicate()] * 2) + r


def _run(machine_path_or_machine):
    kbtorch.use(machine_path_or_machine)
    torch.manual_seed(0)
    x, r = torch.randn(64, 256), torch.randn(64, 256)
    mesh = kbtorch.init_device_mesh()           # (chips, PEs): one chip here
    xs = kbtorch.distribute_tensor(x.to("ahbm"), mesh, [kbtorch.Shard(0)] * 2)
    ra = kbtorch.distribute_tensor(r.to("ahbm"), mesh, [kbtorch.Replicate()] * 2)
    with kbtorch.graph() as g:
        got = _gather_then_add(xs, ra)
    torch.testing.assert_close(got.cpu(), x + r)
    return g


def test_a_gather_inside_one_memory_is_a_barrier_that_moves_nothing():
    try:
        g = _run(DIEWIDE)
    finally:
        kbtorch.use("ahbm")
    kinds = [k.kernel for k in g.plan.kernels]
    assert kinds[0] == "barrier (shared copy)"
    gather = g.kernels[0].timed
    assert gather.kernel.startswith("all_gather") and one_memory(g.machine, gather.groups)
    assert memory_bytes(g.machine, g.schedule.result) < memory_bytes(g.machine, gather.result) + \
        memory_bytes(g.machine, g.kernels[1].timed.result)
    assert g.latency_ns < (gather.result.latency_ps + g.kernels[1].timed.result.latency_ps) / 1000


def test_where_each_pe_owns_its_memory_nothing_changes(small):
    g = _run(small)
    assert not one_memory(small, g.kernels[0].timed.groups)
    assert g.plan.kernels[0].kernel.startswith("all_gather")


def test_the_barrier_tells_the_first_pe_then_everyone():
    progs = barrier(((0, 1, 2), (3, 4)))
    sends = {pe: [c.dst_pe for c in cmds if c.engine == "ipcq"] for pe, cmds in progs.items()}
    assert sends == {0: [1, 2], 1: [0], 2: [0], 3: [4], 4: [3]}
    assert progs[0][0].waits[0].threshold == 2 and progs[3][0].waits[0].threshold == 1


def test_a_replicated_pass_runs_once_per_memory_when_that_is_faster():
    """On one die-wide memory a replicated add is split over the PEs and met at a barrier
    (each PE writes its part of the one copy); a tiny one stays whole on every PE."""
    kbtorch.use(DIEWIDE)
    try:
        mesh = kbtorch.init_device_mesh()
        big, small_ = (kbtorch.distribute_tensor(torch.randn(*s).to("ahbm"), mesh, [kbtorch.Replicate()] * 2)
                       for s in ((256, 1024), (2, 4)))
        with kbtorch.graph(fuse=False) as g:
            out = big + big
            tiny = small_ + small_
        torch.testing.assert_close(out.cpu(), 2 * big.cpu())
        torch.testing.assert_close(tiny.cpu(), 2 * small_.cpu())
    finally:
        kbtorch.use("ahbm")
    split, whole = g.plan.kernels
    assert split.kernel == "elementwise add (shared copy)" and whole.kernel == "elementwise add"
    replicated = g.kernels[0].timed.result
    assert replicated.vector.copies == 8
    sends = [c for cmds in split.programs.values() for c in cmds if c.engine == "ipcq"]
    assert len(sends) == 2 * 7              # 7 arrivals at PE 0, 7 releases from it
    alone = kbtorch.kernel.run_programs(split.programs, g.machine, mode="fast")
    assert alone.latency_ps < replicated.latency_ps
    assert memory_bytes(g.machine, alone) < memory_bytes(g.machine, replicated) / 4
