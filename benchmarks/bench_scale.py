"""Simulation at scale (issue 42): ``fidelity="auto"`` against ``"exact"``, side by side.

- **validation**: every case run both ways in one process: latency error, the largest
  difference in a component kind's share of the attribution (points), the largest relative
  difference of a work counter (link flits, engine commands, memory bursts; an eager step's
  bytes), events and wall both ways, and how auto obtained its figure (``kernel.steady.Obtained``). Targets: <= 0.5%
  latency, <= 1 point of attribution, in every case.
- **scale**: the issue's walls (x8 all-gather of 500 MiB per chip, best algorithm; a 1 GiB
  all-reduce over AHBM's 256 PEs; a ring all-gather of 1 GiB per member over a CUBE in fast
  mode), auto against exact.
- **models** (full run, with the ``[hf]`` extra): ``hf_generate``'s Qwen2.5-7B on ahbm,
  timing only, static cache, each point in a process of its own: 128 + 128 tokens in graph
  mode, auto against exact (its wall, and the time to first token and per output token
  both ways), and 128 + 8 tokens in graph mode against eager.

``--quick`` (under 3 minutes): the small half of the cases, no model case and no 500 MiB
or 256-PE row. ``--json``
prints one JSON object (progress goes to stderr).

    python benchmarks/bench_scale.py [--quick] [--json]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import platform
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

from tabulate import tabulate

from kbtorch.kernel import current_fidelity, use_fidelity
from kbtorch.ops.attention import attention
from kbtorch.ops.collective import KINDS, collective, concurrent_run
from kbtorch.ops.gemm import gemm
from kbtorch.ops.vector import elementwise
from kbtorch.topology import load_machine

KiB, MiB, GiB = 2**10, 2**20, 2**30
X8 = "across:chip:4"


@dataclass
class Profiled:
    """A step's profile seen as one run by ``side_by_side``: its ops' latency summed, the
    events of the distinct runs behind them, how they were obtained (``Profile.obtained``)
    and the latency's shares by op and bottleneck kind (the attribution at op level)."""

    prof: object

    @property
    def latency_ps(self) -> int:
        return round(self.prof.total_ns * 1000)

    @functools.cached_property
    def obtained(self):
        o = self.prof.obtained()
        return SimpleNamespace(method="+".join(sorted(o["ops_by_method"])), events_simulated=o["events_simulated"],
                               error_bound=o["error_bound"])

    @property
    def events(self) -> int:
        return self.obtained.events_simulated

    def breakdown(self) -> dict:
        out: dict = {}
        for r in self.prof.records:
            key = f"{r.name} ({r.bottleneck})"
            out[key] = out.get(key, 0) + r.latency_ns * 1000
        return out


@functools.lru_cache(maxsize=None)
def _step(model: str, topology: str, tp: int | None):
    from kbtorch.serve.simulated import SimulatedStep
    return SimulatedStep(model, topology, tp=tp, held_out=())


@dataclass(frozen=True)
class ModelCase:
    """A step of a model (a ``SimulatedStep``, built by ``prepare`` outside the timed runs):
    Qwen2.5-7B's forward of ``new`` tokens after ``past`` as one graph (``graph``), or
    ``rows`` x ``new`` tokens of ``model`` eager (a ``Profiled`` profile).

    NOTE: graph mode's periodic shortcut (docs/model.md, "Graph mode") holds under both
    fidelities, so a graph case's ``exact`` side is every event (``periodic=False``): the
    shortcut against full simulation."""

    model: str
    topology: str
    tp: int | None
    rows: int
    new: int
    past: int
    graph: bool

    def prepare(self):
        return _step(self.model, self.topology, self.tp)

    def __call__(self):
        step = self.prepare()
        if self.graph:
            periodic = current_fidelity() == "auto"
            return step.forward(self.rows, self.new, self.past, graph=dict(periodic=periodic))[1].schedule.result
        return Profiled(step.forward(self.rows, self.new, self.past)[0])


def model_cases() -> list:
    """(name, heavy, run) of the model cases (Hugging Face models built from configs: the
    ``[hf]`` extra); none without transformers."""
    if importlib.util.find_spec("transformers") is None:
        return []
    return [("graph decode Qwen2.5-7B, 1 x 1024 positions, maia200 (exact: periodic=False)", True,
             ModelCase("qwen2.5-7b", "maia200", None, 1, 1, 1024, True)),
            ("graph prefill Qwen2.5-7B, 128 tokens, maia200 (exact: periodic=False)", True,
             ModelCase("qwen2.5-7b", "maia200", None, 1, 128, 0, True)),
            ("Llama-3-70B TP 8 decode step, 16 x 1024 positions, maia200_x8 (eager)", True,
             ModelCase("llama3-70b", "maia200_x8", 8, 16, 1, 1024, False))]


def _coll(kind: str, machine: str, nbytes: int, **kw):
    return lambda: collective(kind, machine=machine, nbytes=nbytes, dtype="bf16", **kw).result


def cases(quick: bool) -> list:
    """(name, heavy, run) of every validation case; ``run()`` gives a RunResult (or a
    ``Profiled`` step)."""
    out = []
    for m in ("ahbm", "maia200"):
        for shape in ((1024, 1024, 1024), (4096, 1024, 2048), (64, 4096, 4096)):
            out.append((f"gemm {'x'.join(map(str, shape))} {m}", False,
                        lambda m=m, shape=shape: gemm(shape=shape, dtype="bf16", machine=m).result))
    out.append(("attention prefill 1x28x4x1024x1024x128 causal ahbm", False,
                lambda: attention(shape=(1, 28, 4, 1024, 1024, 128), is_causal=True, machine="ahbm").result))
    out.append(("attention decode 1x28x4x1x4096x128 ahbm", False,
                lambda: attention(shape=(1, 28, 4, 1, 4096, 128), machine="ahbm").result))
    out.append(("vector add 16M ahbm", False, lambda: elementwise("add", 16 * 2**20, machine="ahbm").result))
    for kind in KINDS:
        for nbytes in (1 * MiB, 16 * MiB, 64 * MiB):
            out.append((f"{kind} {nbytes // MiB} MiB cube ahbm", nbytes > 16 * MiB,
                        _coll(kind, "ahbm", nbytes, group="cube:0")))
    for kind in KINDS:
        for per in (1 * MiB, 16 * MiB, 64 * MiB):
            out.append((f"{kind} {per // MiB} MiB/chip across maia200_x8", per > 1 * MiB,
                        _coll(kind, "maia200_x8", per * 8 if kind in ("all_gather", "all_to_all") else per, group=X8)))
    for kind, algo in (("all_gather", "ring"), ("reduce_scatter", "ring"), ("all_reduce", "ring")):
        for nbytes, packet in ((8 * MiB, 4 * KiB), (64 * MiB, 64 * KiB)):
            out.append((f"{kind} {algo} {nbytes // MiB} MiB packets {packet // KiB} KiB cube ahbm fast",
                        nbytes > 8 * MiB, _coll(kind, "ahbm", nbytes, group="cube:0", algo=algo, mode="fast",
                                                packet_bytes=packet)))
    out.append(("2 concurrent all-reduces of 4 MiB (cubes 0, 1) ahbm", False,
                lambda: concurrent_run([dict(kind="all_reduce", group=f"cube:{c}", nbytes=4 * MiB, algo="ring") for c in (0, 1)],
                                       machine="ahbm")[0]))
    ag = dict(kind="all_gather", nbytes=8 * MiB, algo="ring", packet_bytes=4 * KiB)
    out.append(("2 concurrent ring all-gathers of 8 MiB, 4 KiB packets (cubes 0, 1) ahbm fast", False,
                lambda: concurrent_run([dict(ag, group=f"cube:{c}") for c in (0, 1)], machine="ahbm", mode="fast")[0]))
    out += model_cases()
    return [c for c in out if not (quick and c[1])]


def shares(result) -> dict:
    bd = result.breakdown()
    return {k: v / result.latency_ps for k, v in bd.items()}


def work(result) -> dict:
    """The work a run counted: link flits per kind, engine commands per role, memory bursts in
    all (a ``Profiled`` step: its ops' bytes in all)."""
    if isinstance(result, Profiled):
        return {"bytes": sum(r.bytes or 0 for r in result.prof.records)}
    st = result.stats
    return {**{("flits", k): v["flits"] for k, v in st["links"].items()},
            **{("commands", k): v["commands"] for k, v in st["engines"].items()},
            "bursts": sum(m["bursts"] for m in st["memories"].values())}


def counters_pct(exact, auto) -> float:
    """The largest relative difference (%) of any work counter of ``auto`` from ``exact``'s."""
    we, wa = work(exact), work(auto)
    return 100 * max((abs(wa.get(k, 0) - v) / v for k, v in we.items() if v), default=0.0)


def side_by_side(run) -> dict:
    """``run`` under both fidelities; the figures side by side (what ``run.prepare`` builds,
    if it has one, before either is timed)."""
    getattr(run, "prepare", lambda: None)()
    got = {}
    for fid in ("exact", "auto"):
        t0 = time.perf_counter()
        with use_fidelity(fid):
            r = run()
        got[fid] = (r, time.perf_counter() - t0)
    (e, we), (a, wa) = got["exact"], got["auto"]
    se, sa = shares(e), shares(a)
    o = a.obtained
    return {"exact_ns": e.latency_ps / 1000, "auto_ns": a.latency_ps / 1000,
            "err_pct": 100 * (a.latency_ps - e.latency_ps) / e.latency_ps,
            "share_pts": 100 * max(abs(sa.get(k, 0) - se.get(k, 0)) for k in set(sa) | set(se)),
            "counters_pct": counters_pct(e, a),
            "events_exact": e.events, "events_auto_simulated": o.events_simulated, "wall_exact_s": we,
            "wall_auto_s": wa, "method": o.method, "claimed_pct": 100 * o.error_bound}


def validation(quick: bool, say) -> list:
    rows = []
    for name, _, run in cases(quick):
        rows.append(dict(side_by_side(run), case=name))
        r = rows[-1]
        say(f"  {name}: {r['err_pct']:+.4f}% {r['share_pts']:.3f} pts counters {r['counters_pct']:.3f}% {r['method']} "
            f"({r['wall_exact_s']:.1f} s / {r['wall_auto_s']:.1f} s)")
    return rows


#: The issue's absolute walls (this 2-core machine) of the scale rows that have one.
WALL_S = {"maia200_x8 all-gather 500 MiB per chip, hier (the best)": 60.0,
          "all-reduce 1 GiB over AHBM's 256 PEs, best algorithm": 30.0}


def scale(quick: bool, say) -> list:
    x8 = load_machine("maia200_x8")
    big = [("all-gather ring 1 GiB per member, cube, fast, 256 KiB packets",
            _coll("all_gather", "ahbm", GiB, group="cube:0", algo="ring", mode="fast", packet_bytes=256 * KiB))]
    if not quick:
        big.append(("maia200_x8 all-gather 500 MiB per chip, hier (the best)",
                    _coll("all_gather", x8, 500 * MiB * 8, group=X8, algo="hier")))
        big.append(("all-reduce 1 GiB over AHBM's 256 PEs, best algorithm",
                    _coll("all_reduce", "ahbm", GiB, group="all")))
    rows = []
    for name, run in big:
        rows.append(dict(side_by_side(run), case=name))
        say(f"  {name}: exact {rows[-1]['wall_exact_s']:.1f} s, auto {rows[-1]['wall_auto_s']:.1f} s "
            f"({rows[-1]['method']}, {rows[-1]['err_pct']:+.4f}%)")
    return rows


#: The model points (mode, prompt, new tokens, fidelity) of ``models``.
QWEN_POINTS = (("graph", 128, 128, "auto"), ("graph", 128, 128, "exact"), ("graph", 128, 8, "auto"),
               ("eager", 128, 8, "auto"))
#: The issue's wall of Qwen2.5-7B's 128 + 128 tokens in graph mode (auto; this 2-core machine).
QWEN_WALL_S = 60.0


def models(quick: bool, say) -> dict:
    """``QWEN_POINTS``, each in a process of its own (``bench_graph.run_point``: its wall and
    peak alone): ``{key: record}`` (none with ``--quick`` or without transformers)."""
    if quick or importlib.util.find_spec("transformers") is None:
        return {}
    from bench_graph import run_point
    out = {}
    for mode, prompt, new, fidelity in QWEN_POINTS:
        key = f"{mode} {prompt}+{new} {fidelity}"
        out[key] = run_point("hf", mode, prompt, new, 28, "static", fidelity)
        say(f"  {key}: {out[key]['wall_s']:.1f} s, TTFT {out[key]['ttft_us']:.1f} us, TPOT {out[key]['tpot_us']:.1f} us")
    return out


def model_targets(qwen: dict) -> list:
    if not qwen:
        return []
    a, e = qwen["graph 128+128 auto"], qwen["graph 128+128 exact"]
    g, eager = qwen["graph 128+8 auto"], qwen["eager 128+8 auto"]
    err = max(abs(a[k] - e[k]) / e[k] for k in ("ttft_us", "tpot_us")) * 100
    return [{"target": f"Qwen2.5-7B 128 + 128 graph static: auto <= {QWEN_WALL_S:.0f} s and >= 2x faster than exact",
             "measured": f"exact {e['wall_s']:.1f} s -> auto {a['wall_s']:.1f} s (TTFT, TPOT within {err:.4f}%)",
             "pass": a["wall_s"] <= QWEN_WALL_S and 2 * a["wall_s"] <= e["wall_s"]},
            {"target": "Qwen2.5-7B 128 + 8 graph static: wall <= eager's",
             "measured": f"graph {g['wall_s']:.1f} s, eager {eager['wall_s']:.1f} s",
             "pass": g["wall_s"] <= eager["wall_s"]}]


def table(rows: list) -> str:
    return tabulate([(r["case"], f"{r['exact_ns']:,.1f}", f"{r['err_pct']:+.4f}", f"{r['share_pts']:.3f}",
                      f"{r['counters_pct']:.3f}", r["events_exact"], r["events_auto_simulated"], f"{r['wall_exact_s']:.2f}",
                      f"{r['wall_auto_s']:.2f}", r["method"], f"{r['claimed_pct']:.3f}") for r in rows],
                    headers=("case", "exact ns", "auto err %", "share pts", "counters %", "events exact", "events auto",
                             "wall exact s", "wall auto s", "auto method", "claimed %"), disable_numparse=True)


def targets(val: list, big: list) -> list:
    worst_err = max(abs(r["err_pct"]) for r in val)
    worst_share = max(r["share_pts"] for r in val)
    out = [{"target": f"validation: {len(val)} cases, every one <= 0.5% latency", "measured": f"worst {worst_err:.4f}%",
            "pass": worst_err <= 0.5},
           {"target": "validation: every case <= 1 point of attribution", "measured": f"worst {worst_share:.3f} pts",
            "pass": worst_share <= 1.0}]
    for r in big:
        wall = WALL_S.get(r["case"])
        if wall is None:
            goal, met = "auto >= 2x faster than exact", r["wall_auto_s"] * 2 <= r["wall_exact_s"]
        else:
            goal, met = f"auto <= {wall:.0f} s", r["wall_auto_s"] <= wall
        out.append({"target": f"{r['case']}: {goal}, within 0.5%",
                    "measured": f"{r['wall_exact_s']:.1f} s -> {r['wall_auto_s']:.1f} s ({r['method']}), "
                                f"{r['err_pct']:+.4f}%",
                    "pass": met and abs(r["err_pct"]) <= 0.5})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small cases only, no 500 MiB row (under 3 minutes)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (progress on stderr)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = sys.stderr if args.json else sys.stdout
    say = lambda s: print(s, file=out, flush=True)        # noqa: E731
    say("validation: auto against exact")
    val = validation(args.quick, say)
    say("scale")
    big = scale(args.quick, say)
    say("models")
    qwen = models(args.quick, say)
    tg = targets(val, big) + model_targets(qwen)
    if args.json:
        print(json.dumps({"validation": val, "scale": big, "models": qwen, "targets": tg,
                          "wall_s": time.perf_counter() - t0,
                          "python": platform.python_version(), "quick": args.quick}))
        return 0
    print("\n" + table(val) + "\n\n" + table(big))
    print("\ntargets\n" + tabulate([(t["target"], t["measured"], "PASS" if t["pass"] else "FAIL") for t in tg],
                                   headers=("target", "measured", ""), disable_numparse=True))
    print(f"\n{time.perf_counter() - t0:.0f} s on {platform.python_implementation()} {platform.python_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
