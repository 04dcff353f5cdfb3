"""The front end's choices: the machine a tensor lives on, moves of modules, context-local modes."""
import threading

import pytest
import torch

import kbtorch
from kbtorch.tensor.stream import clock_ns


def test_a_tensor_remembers_its_machine_and_two_machines_do_not_mix(tiny):
    a = torch.randn(8, 4).to("ahbm")
    with kbtorch.use(tiny):
        b = torch.randn(8, 4).to("ahbm")
        assert kbtorch.current_machine() is tiny
        c = b + b                                   # runs on tiny's 8 PEs
    assert a.machine is kbtorch.current_machine() and b.machine is tiny and c.machine is tiny
    assert len(b._spec.mesh.pes) == 8 and torch.equal(c.cpu(), 2 * b.cpu())
    with pytest.raises(RuntimeError, match=r"two machines, '(ahbm|tiny)' and '(ahbm|tiny)'"):
        a + b


def test_the_hbm_book_is_per_machine_and_per_memory_node(tiny):
    from kbtorch.tensor.hbm import hbm_book
    book = hbm_book(tiny)
    node = tiny.memory(0, "hbm")
    assert book.nodes[node].capacity == tiny.node_capacity(node)
    before = book.free(0)
    with kbtorch.use(tiny), kbtorch.timing_only():
        t = torch.empty(1 << 20, dtype=torch.float16, device="ahbm")      # sharded over 8 PEs
    per_node = sum(1 for pe in t._spec.mesh.pes if tiny.memory(pe, "hbm") == node) * (2 << 20) // 8
    assert before - book.free(0) == per_node
    assert hbm_book(kbtorch.current_machine()) is not book


def test_module_to_ahbm_after_a_cpu_forward_in_grad_mode():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    x = torch.randn(3, 16)
    y = m(x)                                        # the graph still references the weights
    m.to("ahbm")
    assert all(p.device.type == "ahbm" for p in m.parameters())
    with torch.no_grad():
        torch.testing.assert_close(m(x.to("ahbm")).cpu(), y.detach())


def test_a_module_whose_move_fails_midway_is_unchanged():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    before = {n: (p, p.detach().clone()) for n, p in m.named_parameters()}
    calls = []

    def fn(t):
        calls.append(t)
        if len(calls) == 3:
            raise RuntimeError("no room")
        return t.to("ahbm")
    with pytest.raises(RuntimeError, match="no room"):
        m._apply(fn)
    for n, p in m.named_parameters():
        assert p is before[n][0] and p.device.type == "cpu" and torch.equal(p, before[n][1])


def test_timing_only_and_profile_are_local_to_a_thread():
    seen = {}
    go = threading.Barrier(2)

    def run(name, timing):
        with kbtorch.profile() as prof:
            if timing:
                with kbtorch.timing_only():
                    go.wait()
                    t = torch.ones(8, 4, device="ahbm")
            else:
                go.wait()
                t = torch.ones(8, 4, device="ahbm")
            s = t + t
        seen[name] = (t._value.is_meta, [r.name for r in prof.records], clock_ns(), s.shape)
    threads = [threading.Thread(target=run, args=(n, n == "meta")) for n in ("meta", "data")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert seen["meta"][0] and not seen["data"][0]
    assert seen["meta"][1] == seen["data"][1] == ["aten::add"]
    assert seen["meta"][2] == seen["data"][2] > 0            # each thread's clock starts at 0
