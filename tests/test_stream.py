"""The ahbm device's stream: records at the clock, context-local listeners, one summary."""
import ast
import contextvars
from pathlib import Path

import pytest

from kbtorch.ops.contract import bottleneck, tflops
from kbtorch.ops.vector import elementwise
from kbtorch.tensor import stream
from kbtorch.tensor.timing import Timed
from kbtorch.topology.kinds import kind_name

TENSOR = Path(stream.__file__).parent


def test_a_record_starts_at_the_clock_and_advances_it():
    def run():
        t0 = stream.clock_ns()
        got = []
        with stream.listen(got):
            a = stream.record("a", ((2,),), "k", 5.0, flops=10_000)
            inner = []
            with stream.listen(inner):
                b = stream.record("b", (), "k", 2.5)
        c = stream.record("c", (), "k", 1.0)
        assert (a.start_ns, b.start_ns, c.start_ns) == (t0, t0 + 5.0, t0 + 7.5)
        assert got == [a, b] and inner == [b] and stream.clock_ns() == t0 + 8.5
        assert a.tflops == tflops(10_000, 5.0) == 10_000 / 5.0 / 1000 and c.tflops == 0.0
        return stream.clock_ns()
    before = stream.clock_ns()
    assert contextvars.copy_context().run(run) == before + 8.5
    assert stream.clock_ns() == before                  # another context's clock did not move


def test_a_kernel_run_is_recorded_with_its_bytes_and_friendly_bottleneck(tiny):
    run = elementwise("add", 4096, machine=tiny, pes=(0, 1))
    got = []
    with stream.listen(got):
        rec = stream.record_run(tiny, Timed("aten::add", ((4096,),), "vector add", run.result, 4096))
    assert got == [rec] and rec.latency_ns == run.latency_ns and rec.bytes == run.mem_bytes(None)
    assert rec.bottleneck == kind_name(bottleneck(run.result)) == kind_name(run.bottleneck)
    assert rec.bottleneck and rec.usage and all(0 <= f <= 1 for _, f in rec.usage)


@pytest.mark.parametrize("path", sorted(TENSOR.glob("*.py")), ids=lambda p: p.name)
def test_the_tensor_layer_never_imports_the_profiler(path):
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [(n.module or "") + "".join(f".{a.name}" for a in n.names)
              for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if "profiler" in m.split(".")], path.name
