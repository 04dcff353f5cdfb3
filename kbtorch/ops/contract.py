"""The one contract of every op family: dtypes, machine resolution, result and registry.

A family (GEMM, collectives, attention, vector ops) supplies a plan, a tile kernel, an
analytic estimate and a torch reference, runs its kernel through ``kernel.launch`` and
returns an :class:`OpRun`; it registers an :class:`OpFamily` (``register``) so that the
command line and design-space sweeps find it by name, with its parameters as data, and so
that its conformance test (tests/test_op_families.py, as OpInfo for torch ops) runs its
sample params from the moment it registers.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..kernel.door import RunResult, resource_ps
from ..kernel.policy import sim_mode
from ..topology import as_machine

__all__ = ["DType", "DTYPES", "dtype_of", "check_pes", "as_machine", "memory_bytes", "bottleneck", "tflops", "sim_mode", "OpRun",
           "Param", "Sample", "OpFamily", "register", "family", "families"]




@dataclass(frozen=True)
class DType:
    """An element type: its name in topology files and commands, torch dtype, bytes, and the
    name of the peak it runs at (``rate``: both fp8 formats run at the ``fp8`` peak)."""

    name: str
    torch: torch.dtype
    bytes: int
    rate: str


DTYPES = {d.name: d for d in (
    DType("f16", torch.float16, 2, "f16"), DType("bf16", torch.bfloat16, 2, "bf16"),
    DType("fp32", torch.float32, 4, "fp32"), DType("fp8_e4m3", torch.float8_e4m3fn, 1, "fp8"),
    DType("fp8_e5m2", torch.float8_e5m2, 1, "fp8"))}
_BY_TORCH = {d.torch: d for d in DTYPES.values()}


def dtype_of(x, op: str = "kbtorch") -> DType:
    """The DType of a name, a torch dtype or a tensor; ValueError names the op and the type."""
    t = x.dtype if isinstance(x, torch.Tensor) else x
    found = _BY_TORCH.get(t) if isinstance(t, torch.dtype) else DTYPES.get(t)
    if found is None:
        what = f"unknown dtype '{t}'" if isinstance(t, str) else f"dtype {t} is not supported"
        raise ValueError(f"{op}: {what} (supported: {', '.join(DTYPES)})")
    return found


def check_pes(machine, pes, op: str) -> list:
    """``pes`` as a list (None: every PE of ``machine``); ValueError naming ``op`` unless they
    are PE ids of the machine, each once, at least one."""
    n = len(machine.pes)
    if pes is None:
        return list(range(n))
    out = list(pes)
    for pe in out:
        if isinstance(pe, bool) or not isinstance(pe, numbers.Integral) or not 0 <= pe < n:
            raise ValueError(f"{op}: PE {pe!r} does not exist on topology '{machine.name}' (PEs 0..{n - 1})")
    if not out:
        raise ValueError(f"{op}: the PE list is empty")
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: PE {next(p for p in out if out.count(p) > 1)} is listed twice")
    return [int(pe) for pe in out]


def memory_bytes(machine, result: RunResult, kind: str | None = "hbm") -> int:
    """Bytes a run's memories of ``kind`` (None: every memory) served: their bursts times
    each memory's burst size."""
    g = machine.graph
    return sum(s["bursts"] * machine.burst_bytes(n) for n, s in result.stats["memories"].items()
               if kind is None or g.nodes[n]["kind"] == kind)


def bottleneck(result: RunResult) -> str:
    """The component kind holding most of a run's latency ("" for an empty run)."""
    parts = result.breakdown()
    return max(parts, key=lambda k: (parts[k], k)) if parts else ""


def tflops(flops: int, latency_ns: float) -> float:
    """TFLOP/s of ``flops`` done in ``latency_ns`` (0 for no time)."""
    return flops / latency_ns / 1000 if latency_ns else 0.0


@dataclass(kw_only=True)
class OpRun:
    """One simulated op: its latency and where it went, work done, and the models beside it.

    ``flops`` is the op's arithmetic; memory bytes come from the simulator's own burst counts
    (``mem_bytes``); ``analytic_ps`` is the family's estimate and ``bound_ps`` a lower bound
    (None where the family has none); ``plan`` describes the tiling or algorithm chosen."""

    op: str
    machine: object = field(repr=False)
    result: RunResult = field(repr=False)
    pes: tuple
    dtype: str
    flops: int = 0
    analytic_ps: int | None = None
    bound_ps: int | None = None
    plan: str = ""

    @property
    def latency_ps(self) -> int:
        return self.result.latency_ps

    @property
    def latency_ns(self) -> float:
        return self.result.latency_ns

    def breakdown(self) -> dict:
        return self.result.breakdown()

    @property
    def bottleneck(self) -> str:
        """The component kind holding most of the latency."""
        return bottleneck(self.result)

    def mem_bytes(self, kind: str | None = "hbm") -> int:
        """Bytes the memories of ``kind`` (None: every memory) served, from their burst counts."""
        return memory_bytes(self.machine, self.result, kind)

    @property
    def hbm_bytes(self) -> int:
        return self.mem_bytes("hbm")

    @property
    def tflops(self) -> float:
        return tflops(self.flops, self.latency_ns)

    @property
    def peak_tflops(self) -> float:
        """The summed GEMM peak of the PEs used for this op's dtype."""
        return self.machine.peak_tflops(DTYPES[self.dtype].rate, self.pes)

    @property
    def pct_peak(self) -> float:
        return 100 * self.tflops / self.peak_tflops

    @property
    def hbm_gbps_peak(self) -> float:
        return self.machine.hbm_gbps(self.pes)

    @property
    def hbm_gbps(self) -> float:
        return self.hbm_bytes / self.latency_ns if self.latency_ns else 0.0

    @property
    def pct_hbm(self) -> float:
        return 100 * self.hbm_gbps / self.hbm_gbps_peak

    @property
    def pct_bound(self) -> float | None:
        return 100 * self.bound_ps / self.latency_ps if self.bound_ps and self.latency_ps else None

    @property
    def bound_ns(self) -> float | None:
        return None if self.bound_ps is None else self.bound_ps / 1000

    @property
    def analytic_ns(self) -> float | None:
        return None if self.analytic_ps is None else self.analytic_ps / 1000

    def summary(self) -> dict:
        """The figures every family reports (JSON-ready)."""
        return {"op": self.op, "plan": self.plan, "dtype": self.dtype, "pes": len(self.pes),
                "latency_ns": self.latency_ns, "flops": self.flops, "tflops": self.tflops,
                "hbm_bytes": self.hbm_bytes, "bottleneck": self.bottleneck, "analytic_ns": self.analytic_ns,
                "bound_ns": self.bound_ns,
                "events": self.result.events, "wall_s": self.result.wall_s}


@dataclass(frozen=True)
class Param:
    """A parameter of a family's timing-only run, as the command line and sweeps give it:
    ``kind`` is ``int``, ``bytes``, ``float``, ``str``, ``pes``, ``dtype``, ``shape`` (ints
    separated by commas) or ``flag``; ``choices`` limits a ``str``."""

    name: str
    kind: str
    default: object = None
    help: str = ""
    choices: tuple = ()
    required: bool = False

    def check(self, value, machine) -> None:
        """ValueError naming the param unless ``value`` is of its kind, as the run takes it
        (``bytes`` as an int, ``pes`` as PE ids of ``machine``, ``shape`` as ints)."""
        test, want = _KINDS[self.kind]
        if not test(self, value, len(machine.pes)):
            want = "one of {choices}" if self.choices else want
            want = want.format(choices=", ".join(self.choices or DTYPES), last=len(machine.pes) - 1)
            raise ValueError(f"{self.name}: expected {want}, got {value!r}")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _ids(v, n_pes: int) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_pes for i in v)


#: Param kind -> (test(param, value, PEs of the machine), what it expects).
_KINDS = {
    "int": (lambda p, v, n: _count(v), "a positive int"),
    "bytes": (lambda p, v, n: _count(v), "a positive int (bytes)"),
    "float": (lambda p, v, n: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "flag": (lambda p, v, n: isinstance(v, bool), "true or false"),
    "str": (lambda p, v, n: isinstance(v, str) and (not p.choices or v in p.choices), "a string"),
    "dtype": (lambda p, v, n: isinstance(v, str) and v in DTYPES, "one of {choices}"),
    "shape": (lambda p, v, n: isinstance(v, (list, tuple)) and bool(v) and all(_count(i) for i in v),
              "positive ints"),
    "pes": (lambda p, v, n: _ids(v, n), "PE ids 0..{last}"),
}


@dataclass(frozen=True)
class Sample:
    """One run of a family as data, as OpInfo's sample inputs: ``params`` as its run takes
    them, small enough for an 8-PE test machine (``tests/data/tiny.toml``); a bad sample's
    ``refused`` is the word its ValueError must contain (the param at fault)."""

    params: dict
    refused: str = ""


@dataclass(frozen=True)
class OpFamily:
    """A registered op family: ``run(machine=..., **params) -> OpRun`` (timing only; call the
    family itself to have its params checked first), ``reference`` (the torch definition of
    its numerics) and its parameters; ``check(machine=..., **params)`` runs the checks ``run``
    makes before any work (shapes, PEs, groups, HBM capacity, limits) and nothing else: a sweep
    refuses bad params with it before any point runs. As data for its conformance test:
    ``samples`` (good params), ``bad`` (params it refuses, by name), ``tolerance`` (the largest
    relative error of ``analytic_ps`` against the simulated latency it states for its samples;
    None: it has no estimate) and ``numeric(machine=..., **params) -> (OpRun, got, want)``: the
    family run on seeded random data, its result and ``reference``'s (None: timing only, the
    caller computes the numbers with torch), equal within ``atol`` (absolute and relative)."""

    name: str
    run: Callable[..., OpRun]
    reference: Callable
    params: tuple = ()
    help: str = ""
    samples: tuple = ()
    bad: tuple = ()
    tolerance: float | None = None
    numeric: Callable | None = None
    atol: float = 0.0
    check: Callable[..., None] | None = None

    def __call__(self, machine=None, **params) -> OpRun:
        """``run`` with every declared param checked first (ValueError naming the family and the param)."""
        machine = as_machine(machine)
        for prm in self.params:
            if prm.name in params and params[prm.name] is not None:
                try:
                    prm.check(params[prm.name], machine)
                except ValueError as exc:
                    raise ValueError(f"{self.name}: {exc}") from None
        return self.run(machine=machine, **params)


_FAMILIES: dict[str, OpFamily] = {}


def register(fam: OpFamily) -> OpFamily:
    if fam.name in _FAMILIES:
        raise ValueError(f"op family '{fam.name}' is registered twice")
    _FAMILIES[fam.name] = fam
    return fam


def family(name: str) -> OpFamily:
    if name not in _FAMILIES:
        raise ValueError(f"unknown op family '{name}' (known: {', '.join(sorted(_FAMILIES))})")
    return _FAMILIES[name]


def families() -> list[OpFamily]:
    """Every registered family, in registration order."""
    return list(_FAMILIES.values())
