"""Bad input gets a clear error, fast, and leaves no half-built state (issue 17).

Each case: the right exception type (the CLI: exit 2, one ``kbtorch: error:`` line and no
traceback), a message that names what is at fault, a refusal well under a second, and the
state it touched (allocators, programs) unchanged. Topology files have their own module
(test_topology_schema.py).
"""
import time

import pytest
import torch

from kbtorch.cli import main
from kbtorch.kernel import build
from kbtorch.ops.attention import attention
from kbtorch.ops.collective import collective
from kbtorch.ops.collective_plan import CollectiveError
from kbtorch.ops.elementwise import elementwise
from kbtorch.ops.gemm import gemm
from kbtorch.runtime import AllocationError, Runtime
from kbtorch.sim.commands import Dma, Loc

CLI = {
    "gemm of a billion rows": (["bench", "gemm", "--m", "1000000000", "--n", "4096", "--k", "4096"],
                               "needs 64000131072 bytes of HBM"),
    "gemm larger than one slice": (["bench", "gemm", "--m", "60000", "--n", "30000", "--k", "30000", "--pes", "0"],
                                   "which holds 6442450944"),
    "all-reduce of a petabyte": (["bench", "allreduce", "--bytes", "1000000000000000"], "argument --bytes"),
    "odd bytes": (["bench", "allreduce", "--bytes", "1001", "--group", "cube"], "argument --bytes: 1001 bytes"),
    "10^11 messages": (["bench", "traffic", "--messages", "100000000000"], "limit of 1000000"),
    "huge messages": (["bench", "traffic", "--messages", "5", "--bytes", "1000GiB"], "KBTORCH_MAX_FLITS"),
    "unknown topology": (["topo", "nowhere"], "unknown topology"),
    "a directory as topology": (["topo", "/"], "/"),
    "attention too large": (["bench", "attention", "--hq", "64", "--hkv", "8", "--lq", "1", "--lk", "10000000000"],
                            "bytes of HBM"),
    "attention too many tiles": (["bench", "attention", "--hq", "64", "--hkv", "8", "--lq", "1", "--lk", "100000000"],
                                 "tiles exceed the limit"),
    "unknown vector op": (["bench", "vector", "--op", "tanhh", "--n", "64"], "no cost for op 'tanhh'"),
}


@pytest.mark.parametrize("argv, fault", CLI.values(), ids=CLI.keys())
def test_cli_refuses_with_one_line(capsys, argv, fault):
    t0 = time.perf_counter()
    assert main(argv) == 2
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert err.startswith("kbtorch: error: ") and fault in err and "Traceback" not in err
    assert elapsed < 1.0, f"refused in {elapsed:.2f} s"


def _refused(exc_type, fault, fn):
    t0 = time.perf_counter()
    with pytest.raises(exc_type, match=fault):
        fn()
    assert time.perf_counter() - t0 < 1.0


API = {
    "gemm float shape": (TypeError, "M=1.5 must be ints", lambda: gemm(shape=(1.5, 8, 8))),
    "gemm unknown dtype": (ValueError, "unknown dtype 'f8'", lambda: gemm(shape=(8, 8, 8), dtype="f8")),
    "gemm too large": (ValueError, "bytes of HBM", lambda: gemm(shape=(10**9, 10**5, 10**5))),
    "collective bool bytes": (CollectiveError, "nbytes > 0", lambda: collective("all_reduce", nbytes=True)),
    "collective petabyte": (CollectiveError, "bytes of HBM", lambda: collective("all_reduce", nbytes=10**15)),
    "collective uneven shares": (CollectiveError, "do not split",
                                 lambda: collective("reduce_scatter", nbytes=1000, group="cube", algo="ring")),
    "attention negative": (ValueError, "six positive ints", lambda: attention(shape=(1, 2, 2, -1, 8, 8))),
    "vector unknown op": (ValueError, "no cost for op 'tanhh'", lambda: elementwise("tanhh", 64)),
}


@pytest.mark.parametrize("exc_type, fault, fn", API.values(), ids=API.keys())
def test_api_refuses_fast(exc_type, fault, fn):
    _refused(exc_type, fault, fn)


def test_runtime_refusals_leave_it_unchanged():
    rt = Runtime("ahbm")
    small = rt.alloc(0, 16)
    allocator = rt.allocator(small.node)
    free = allocator.free_bytes
    _refused(TypeError, "size must be an int", lambda: rt.alloc(0, 1.5))
    _refused(ValueError, "must be positive", lambda: rt.alloc(0, -4))
    assert allocator.free_bytes == free
    big = rt.alloc(1, 1 << 20)
    _refused(ValueError, "not inside a buffer allocated", lambda: rt.launch(0, [Dma(small.loc(), big.loc(), 1 << 20)]))
    _refused(ValueError, "address -256", lambda: rt.launch(0, [Dma(big.loc(), Loc(small.node, -256), 256)]))
    assert rt._programs == {} and allocator.free_bytes == free - 256 * 0


KERNELS = {
    "negative elements": (ValueError, "math add elements must be at least 1", lambda ctx: ctx.math("add", -100)),
    "float bytes": (TypeError, "fetch size must be an int", lambda ctx: ctx.fetch(1.5)),
    "dma past a buffer": (ValueError, "run past the end of buffer 'small'",
                          lambda ctx: ctx.dma_read(ctx.hbm("small", 16), ctx.tcm("big", 1 << 20), 1 << 20)),
    "dma to a negative address": (ValueError, "DMA destination address must be at least 0",
                                  lambda ctx: ctx.dma_write(ctx.tcm("t", 4096), Loc(ctx.hbm_node, -4096), 4096)),
    "tcm overflow": (AllocationError, "TCM buffer 'huge' of 64.00 MiB does not fit", lambda ctx: ctx.tcm("huge", 64 << 20)),
    "one name twice": (ValueError, "buffer 'a' is allocated twice", lambda ctx: (ctx.tcm("a", 256), ctx.tcm("a", 256))),
    "unknown buffer": (KeyError, "no buffer 'nope'", lambda ctx: ctx.buffer("nope")),
}


@pytest.mark.parametrize("exc_type, fault, body", KERNELS.values(), ids=KERNELS.keys())
def test_kernel_api_guards(ahbm, exc_type, fault, body):
    _refused(exc_type, fault, lambda: build(body, [0], ahbm, name="bad"))


def test_json_output_is_always_valid(capsys):
    from kbtorch.cli import _finite
    assert _finite({"a": float("inf"), "b": [1.0, float("nan")], "c": "x"}) == {"a": None, "b": [1.0, None], "c": "x"}


def _on(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype).to("ahbm")


TORCH = {
    "device index": (RuntimeError, "device index 7 is out of range", lambda: torch.ones(2).to("ahbm:7")),
    "factory index": (RuntimeError, "device index 3 is out of range", lambda: torch.zeros(2, device="ahbm:3")),
    "bmm batches": (RuntimeError, "batch2 tensor to be: \\[2, 4\\]", lambda: torch.bmm(_on(2, 3, 4), _on(3, 4, 5))),
    "mm shapes": (RuntimeError, "same reduction dim", lambda: torch.mm(_on(2, 3), _on(4, 5))),
    "mixed dtypes": (RuntimeError, "same dtype", lambda: _on(4, 4, dtype=torch.float16) @ _on(4, 4)),
    "sdpa cpu mask": (RuntimeError, "ahbm and cpu", lambda: torch.nn.functional.scaled_dot_product_attention(
        _on(1, 2, 4, 8), _on(1, 2, 4, 8), _on(1, 2, 4, 8), attn_mask=torch.ones(4, 4, dtype=torch.bool))),
}


@pytest.mark.parametrize("exc_type, fault, fn", TORCH.values(), ids=TORCH.keys())
def test_torch_semantics(exc_type, fault, fn):
    with pytest.raises(exc_type, match=fault):
        fn()


def test_two_meshes_are_refused():
    import kbtorch
    a = kbtorch.distribute_tensor(torch.randn(64, 64), kbtorch.Mesh(range(8), (8,)), [kbtorch.Shard(0)])
    b = kbtorch.distribute_tensor(torch.randn(64, 64), kbtorch.Mesh(range(8, 16), (8,)), [kbtorch.Shard(0)])
    with pytest.raises(RuntimeError, match=r"two sets of PEs \(PEs 0-7 and PEs 8-15\)"):
        a + b
