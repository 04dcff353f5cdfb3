"""``kbtorch bench FAMILY``: one subcommand per registered op family (``ops.contract``).

The families with a command-line module of their own (``OWN_PARSERS``: GEMM's engine table,
the collectives' ``--check``) declare their subcommand there; every other family gets the
generic one, built from its parameters: a timing-only run that prints the figures of its
``OpRun`` and the latency attribution. NOTE: the table lives here, on the command line's
side: an op family never names a command-line module (the layer order, tests/test_imports.py).
"""
from __future__ import annotations

import argparse

from . import cli_collective, cli_gemm, ops
from .cli_common import _byte_count, _finite_float, _pes_arg, _positive_int, _triple, _write_trace
from .ops.contract import DTYPES, families
from .profiler import breakdown_ns, breakdown_table

_TYPES = {"int": _positive_int, "bytes": _byte_count, "float": _finite_float, "str": str, "pes": str, "dtype": str,
          "shape": _triple}


#: Family name -> ``add_parser(bench, parents, family)`` of its own subcommand.
OWN_PARSERS = {"gemm": cli_gemm.add_parser,
               **{kind: cli_collective.add_parser for kind in cli_collective.COLLECTIVES.values()}}


def command_name(family) -> str:
    """``all_reduce`` -> ``allreduce``: the subcommand of a family."""
    return family.name.replace("_", "")


def add_family_parsers(bench, parents) -> None:
    """Declare one ``bench`` subcommand per registered op family."""
    ops.load_families()
    for fam in sorted(families(), key=command_name):
        OWN_PARSERS.get(fam.name, _generic_parser)(bench, parents, fam)


def _generic_parser(bench, parents, fam) -> None:
    p = bench.add_parser(command_name(fam), parents=parents, help=fam.help)
    for prm in fam.params:
        flag = "--" + prm.name.replace("_", "-")
        if prm.kind == "flag":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=prm.default, help=prm.help)
            continue
        kw = dict(help=prm.help, required=prm.required, default=prm.default)
        if prm.kind == "dtype":
            kw["choices"] = tuple(DTYPES)
        elif prm.choices:
            kw["choices"] = prm.choices
        p.add_argument(flag, type=_TYPES[prm.kind], **kw)
    p.add_argument("--flit-exact", action="store_true", help="one event per flit (reference mode)")
    p.set_defaults(func=_cmd_family, family=fam)


def _cmd_family(args, machine):
    fam = args.family
    params = {prm.name: getattr(args, prm.name) for prm in fam.params if getattr(args, prm.name) is not None}
    if "pes" in params:
        params["pes"] = _pes_arg(params["pes"], len(machine.pes))
    run = fam(machine=machine, mode="flit" if args.flit_exact else "fast", trace=bool(args.trace), **params)
    _write_trace(args, run.result)
    data = {"topology": machine.name, "family": fam.name, **run.summary(), "breakdown": breakdown_ns(run.result)}
    head = (f"{run.op} ({run.plan}), {run.dtype}: {run.latency_ns:.3f} ns, {run.tflops:.2f} TFLOP/s, "
            f"{run.hbm_bytes} HBM bytes; {run.result.events} events in {run.result.wall_s:.3f} s")
    return data, "\n\n".join((head, breakdown_table(run.result)))
