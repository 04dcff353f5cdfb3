"""Op coverage checked by PyTorch's own OpInfo samples (``op_db``): every op the ahbm
device claims, on ahbm against CPU.

The claimed ops come from the handler registry (``dispatch.HANDLERS``: a new handler is
tested as soon as an OpInfo names its aten op), plus the composite ops the device runs by
their aten decomposition (``COMPOSITE``). For each, the first ``SAMPLES`` samples per dtype
(float16, bfloat16, float32, int64, int32, bool where the op supports them on CPU) run on
ahbm (the tiny test machine) and are compared with torch on CPU as torch's own tests do
(``torch.testing.assert_close``). A sample may be refused with NotImplementedError naming
what is unsupported; any other error, and any mismatch, fails: no silent wrong result.
"""
import itertools

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

import kbtorch
from kbtorch.tensor.dispatch import HANDLERS

pytest.importorskip("expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

SAMPLES = 3
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.int32, torch.bool)
#: composite ops (no handler of their own) that run as their aten decomposition.
COMPOSITE = ("matmul", "linear", "chunk", "narrow", "__getitem__", "take_along_dim", "argsort", "expand_as",
             "flatten", "movedim", "hstack", "vstack", "type_as", "reshape", "reshape_as", "contiguous",
             "conv1d", "conv2d", "conv3d")
#: ops whose arguments torch wants on the host (only the input moves to ahbm).
HOST_ARGS = {"tensor_split"}
#: OpInfos not run, and why.
SKIP = {"as_strided.partial_views": "its samples read the storage beyond a view; moving a view to any device "
                                    "copies only its elements",
        "norm.nuc": "a nuclear norm needs an SVD (aten.linalg_svd), which the device refuses by name"}
#: ops whose values are unspecified (compared by shape and dtype only).
NO_VALUES = {"empty_like", "new_empty", "new_empty_strided", "rand_like", "randn_like", "randint_like"}
#: GEMMs accumulate in fp32 and round once (the GEMM kernel's rule): torch's CPU kernels
#: may round differently in half precision.
GEMMS = {"mm", "addmm", "bmm", "baddbmm", "mv", "dot", "vdot", "matmul", "linear"}
GEMM_TOL = {torch.float16: dict(rtol=1e-2, atol=1e-2), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}

#: ops every LLM script needs; the registry must claim each (directly or by decomposition).
REQUIRED = ("add", "sub", "mul", "div", "neg", "exp", "rsqrt", "sqrt", "where", "masked_fill", "sigmoid", "tanh", "cos",
            "sin", "clamp", "relu", "silu", "gelu", "eq", "ne", "lt", "gt", "logical_and", "logical_not", "pow",
            "layer_norm", "rms_norm", "softmax", "log_softmax", "sum", "mean", "amax", "amin", "max", "min", "argmax",
            "argmin", "var", "std", "cumsum", "topk", "split", "chunk", "stack", "cat", "narrow", "expand", "repeat",
            "tril", "triu", "flip", "roll", "gather", "scatter", "index_select", "index_put", "zeros_like",
            "ones_like", "full_like", "mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "embedding", "clone",
            # MoE routing (Qwen3-MoE, OLMoE, DeepSeek-V3): counts, sorts, scatters, grouped GEMMs
            "histc", "bincount", "sort", "scatter_add", "_grouped_mm")


def _claimed() -> set:
    return {getattr(op, "overloadpacket", op).__name__ for op in HANDLERS} | set(COMPOSITE)


def _opinfos() -> list:
    claimed = _claimed()
    return [op for op in op_db if _aten(op) in claimed]


def _aten(op) -> str:
    return op.aten_name.removeprefix("nn.functional.")


def _id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def test_the_registry_claims_what_llm_programs_use():
    missing = [name for name in REQUIRED if name not in _claimed()]
    assert not missing, f"no handler for {missing}"


@pytest.fixture(scope="module")
def tiny_machine(tiny_path):
    with kbtorch.use(str(tiny_path)):
        yield


def _to_ahbm(x):
    return x.to("ahbm") if isinstance(x, torch.Tensor) else x


def _compare(name: str, got, ref, dtype) -> None:
    got, ref = tree_flatten(got)[0], tree_flatten(ref)[0]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        if not isinstance(r, torch.Tensor):
            assert g == r
            continue
        g = g.cpu()
        if name in NO_VALUES:
            assert g.shape == r.shape and g.dtype == r.dtype
        else:
            tol = GEMM_TOL.get(dtype, {}) if name in GEMMS else {}
            torch.testing.assert_close(g, r, equal_nan=True, **tol)


@pytest.mark.parametrize("op", _opinfos(), ids=_id)
def test_opinfo_samples_match_cpu(op, tiny_machine):
    """The op's first samples per dtype on ahbm equal CPU's (or are refused by name)."""
    if _id(op) in SKIP:
        pytest.skip(SKIP[_id(op)])
    cpu_dtypes = op.supported_dtypes("cpu")
    if not any(d in cpu_dtypes for d in DTYPES):
        pytest.skip(f"{_id(op)}: none of the dtypes tested")
    ran = 0
    for dtype in (d for d in DTYPES if d in cpu_dtypes):
        for sample in itertools.islice(op.sample_inputs("cpu", dtype), SAMPLES):
            try:
                ref = op(sample.input, *sample.args, **sample.kwargs)
            except Exception:
                continue                       # torch refuses it on CPU too
            inp, args, kwargs = tree_map(_to_ahbm, (sample.input, sample.args, sample.kwargs))
            if _aten(op) in HOST_ARGS:
                args, kwargs = sample.args, sample.kwargs
            try:
                got = op(inp, *args, **kwargs)
            except NotImplementedError as exc:
                assert "kbtorch" in str(exc), exc
                continue
            _compare(_aten(op), got, ref, dtype)
            ran += 1
    assert ran, f"{_id(op)}: no sample ran on ahbm"
