"""An unmodified Hugging Face causal LM on the "ahbm" device: ``model.generate()``, timed.

The model is built from its config (``kbtorch/models/hf.py``: a preset, a config.json or a
local snapshot folder; never a download): full-size ones on the meta device and run
timing-only (no data, default), ``tiny`` ones (and any with ``--check``) with seeded random
weights (``--check`` compares logits and greedy tokens with the same model on CPU). The
weights are placed tensor-parallel (``kbtorch.models.hf.place_plan``, stated in the output: on one
chip over all its PEs; on a system of chips (``--tp`` = the chip count, the default) on the
mesh chips x PEs, across the chips and inside each, partial sums reduced inside each chip and
then across chips); the KV cache is
the one the model uses: ``DynamicCache`` (``--cache dynamic``, Hugging Face's default: each
step concatenates the whole cache) or ``StaticCache`` (``--cache static``: preallocated, each
step writes its new keys and values in place); a cache of the run's batch and positions that
the HBM left by the weights cannot hold is refused (``HbmFull``) before any work. ``--kernels fused`` (default) runs the RMSNorm
layers as one fused op each (``kbtorch.models.hf.fuse_norms``, as a serving stack's kernel does);
``--kernels eager`` runs the layers' own op-by-op chain. Reported, as serving people look
at it: time to first token (the prefill forward), time per output token (each decode
step), tokens/s, the % of the HBM roofline per decode step (bytes read: weights + KV
cache, over the step's simulated time, against ``machine.hbm_gbps`` of all PEs) and the
per-op profile.

    python examples/hf_generate.py --model qwen2.5-7b --prompt-len 128 --new-tokens 8
    python examples/hf_generate.py --model mixtral-8x7b --prompt-len 32 --new-tokens 2 --json
    python examples/hf_generate.py --model tiny --batch 4 --check --cache static
    python examples/hf_generate.py --model tiny-deepseek-v3 --check
    python examples/hf_generate.py --model path/to/snapshot --topology maia200     # its config.json
    python examples/hf_generate.py --model mixtral-8x7b --topology maia200_x8 --ep 8 --prompt-len 32 --new-tokens 2
    python examples/hf_generate.py --model tiny-llama --topology tests/data/tiny_system.toml --pp 2 --microbatches 2 \
        --batch 4 --check
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext

import torch

import kbtorch
from kbtorch import limits
from kbtorch.cli import ArgumentParser, run_script
from kbtorch.kernel import FIDELITIES
from kbtorch.models.hf import (CONFIGS, TINY_EXTRA, build, check_cache_fits, config, fuse_norms, kv_cache, place_plan,
                               place_tp)
from kbtorch.tensor.stream import clock_ns

#: The tiny presets (seeded random weights: data by default); "tiny" is tiny-qwen2.
TINY = {"tiny": "tiny-qwen2", **{f"tiny-{f}": f"tiny-{f}" for f in TINY_EXTRA}}


def parse(argv):
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", metavar="PRESET|CONFIG.json|FOLDER", default="qwen2.5-7b",
                    help=f"a preset ({', '.join((*CONFIGS, *TINY))}), a config.json or a local snapshot folder "
                         "holding one (never downloaded; default qwen2.5-7b)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--timing-only", action="store_true", default=None, help="no data (default for full size)")
    ap.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                    help="the KV cache: DynamicCache (default) or StaticCache")
    ap.add_argument("--kernels", choices=("fused", "eager"), default="fused",
                    help="RMSNorm as one fused op (default) or the layers' eager op chain")
    ap.add_argument("--attn", choices=("auto", "eager", "sdpa"), default="auto",
                    help="attention: sdpa where the model class supports it, else eager (auto, default), or forced")
    ap.add_argument("--mode", choices=("eager", "graph", "both"), default="eager",
                    help="eager: op by op on one stream; graph: each forward captured and timed as one graph "
                         "(kbtorch.graphed: overlap, fusion, one launch; a step with the shapes of an earlier one "
                         "is not simulated again); both: side by side")
    ap.add_argument("--check", action="store_true", help="tiny models: every step's logits (max abs difference within "
                    "the dtype's tolerance) and the greedy tokens against CPU; exit 1 if they differ")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--topology", metavar="NAME|PATH", help="the machine (default: $KBTORCH_TOPOLOGY or ahbm)")
    ap.add_argument("--fidelity", choices=FIDELITIES, help="auto (default): steady states fast-forwarded; "
                    "exact: nothing fast-forwarded (graph mode's periodic layers and re-timed steps hold under "
                    "both; kbtorch.use_fidelity)")
    ap.add_argument("--tp", type=int, metavar="N", help="tensor parallel across N chips and every PE of each "
                    "(default: all the chips of a system over --dp; one chip: all its PEs)")
    ap.add_argument("--dp", type=int, metavar="N", default=1, help="data parallel: N replicas of the model, each "
                    "on chips/N chips with batch/N rows (a system of chips; default 1)")
    ap.add_argument("--ep", type=int, metavar="N", help="expert parallel over the first N chips of a system "
                    "(kbtorch.expert_parallel: experts on chips, all-to-all dispatch/combine)")
    ap.add_argument("--pp", type=int, metavar="N", help="pipeline parallel: the decoder layers in N stages on chip "
                    "groups (kbtorch.pipeline_parallel)")
    ap.add_argument("--microbatches", type=int, default=1, metavar="M", help="micro-batches per call with --pp")
    args = ap.parse_args(argv)
    for name in ("ep", "pp"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"argument --{name}: must be positive, got {getattr(args, name)}")
    if args.ep and args.pp:
        ap.error("--ep with --pp is not supported yet (one plan across chips at a time)")
    if (args.ep or args.pp) and (args.tp or args.dp != 1):
        ap.error("--tp/--dp with --ep/--pp is not supported yet (--ep and --pp place the rest of the model over "
                 "every PE, tensor parallel)")
    if args.microbatches != 1 and not args.pp:
        ap.error("--microbatches needs --pp")
    if args.pp and not 1 <= args.microbatches <= args.batch:
        ap.error(f"argument --microbatches: between 1 and --batch ({args.batch}), got {args.microbatches}")
    try:
        config(TINY.get(args.model, args.model))
    except ValueError as exc:
        ap.error(str(exc))
    if args.timing_only is None:
        args.timing_only = not (args.model in TINY or args.check)
    if args.check and args.timing_only:
        ap.error("--check needs data (a tiny model without --timing-only)")
    if args.dp and args.batch % args.dp:
        ap.error(f"argument --dp {args.dp}: the batch of {args.batch} does not split into {args.dp} replicas")
    for name in ("prompt_len", "new_tokens", "batch", "tp", "dp"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"argument --{name.replace('_', '-')}: must be positive, got {getattr(args, name)}")
    return args


def bound(args) -> None:
    """Refuse sizes the model or the host cannot hold, before anything is built: positions
    against the model's ``max_position_embeddings``, the hidden states of the whole batch
    against ``KBTORCH_MAX_TENSOR_ELEMENTS``."""
    cfg = config(TINY.get(args.model, args.model), args.attn)
    positions = args.prompt_len + args.new_tokens
    # NOTE: a model without max_position_embeddings (bloom's ALiBi) has no bound on positions.
    most = getattr(cfg.get_text_config(), "max_position_embeddings", None)
    if most is not None and positions > most:
        raise ValueError(f"arguments --prompt-len {args.prompt_len} + --new-tokens {args.new_tokens} = {positions} "
                         f"positions exceed {args.model}'s max_position_embeddings of {most}")
    limits.check("elements", args.batch * positions * cfg.hidden_size,
                 f"arguments --batch {args.batch} x {positions} positions x hidden size {cfg.hidden_size} "
                 f"of {args.model}")
    if not args.timing_only:
        # NOTE: with data (--check, a tiny model), the model and its CPU copy are host tensors:
        # the embedding alone refuses a full-size model at once; the rest are counted on the
        # meta device, before anything is allocated.
        import transformers
        what = f"{args.model} with data (--check or without --timing-only): parameters on the host"
        limits.check("elements", cfg.vocab_size * cfg.hidden_size, what)
        with torch.device("meta"):
            params = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(cfg).parameters())
        limits.check("elements", params, what)


def check_plan(args) -> None:
    """Refuse a plan across chips the machine or the model cannot take, before anything is built."""
    machine = kbtorch.current_machine()
    if args.ep:
        try:
            kbtorch.chip_mesh(machine, args.ep)
        except ValueError as exc:
            raise ValueError(f"argument --ep: {exc}") from None
    if args.pp:
        chips = kbtorch.chip_mesh(machine).shape[0]
        layers = config(TINY.get(args.model, args.model)).num_hidden_layers
        if chips % args.pp or layers < args.pp:
            raise ValueError(f"argument --pp: {args.pp} stages need a divisor of the {chips} chip(s) of "
                             f"'{machine.name}' and at most the model's {layers} layers")


def parallel_plan(args, model) -> str:
    """Apply the plan across chips that ``--ep`` / ``--pp`` choose to ``model`` (on ahbm,
    placed by ``place_tp``); -> the plan, as printed."""
    machine = kbtorch.current_machine()
    base = (f"default: every weight over a flat mesh of all {len(machine.pes)} PEs of '{machine.name}' "
            f"(column/row-parallel linears, kbtorch.models.hf.place_tp)")
    if args.ep:
        kbtorch.expert_parallel(model, kbtorch.chip_mesh(machine, args.ep))
        return f"{base}; experts: {model.parallel_plan['expert']}"
    if args.pp:
        kbtorch.pipeline_parallel(model, kbtorch.chip_mesh(machine), args.pp, args.microbatches)
        return model.parallel_plan["pipeline"] + ", each stage's weights over its PEs as the default places them"
    return base


class StepClock:
    """Simulated ns of each forward call of a model (a forward pre-hook and hook), and the
    parallel plan its weights were placed by (in words) and the replica's mesh (None: all PEs)."""

    def __init__(self, model, plan: str = "", where=None):
        self.steps, self._start, self.plan, self.where = [], 0.0, plan, where
        model.register_forward_pre_hook(self._begin)
        model.register_forward_hook(self._end)

    def _begin(self, module, args):
        self._start = clock_ns()

    def _end(self, module, args, out):
        self.steps.append(clock_ns() - self._start)


def run(args, graph: bool = False):
    """(profile, step clock, generated ids on ahbm, CPU reference ids or None, model);
    ``graph``: every forward captured and timed as one graph (``kbtorch.graphed``)."""
    name = TINY.get(args.model, args.model)
    kbtorch.reset_hbm_peaks()
    dtype = torch.bfloat16 if args.timing_only else torch.float32
    data = kbtorch.timing_only if args.timing_only else nullcontext
    model, ref = build(name, dtype, timing_only=args.timing_only, attn=args.attn)
    vocab = model.config.vocab_size
    ids = torch.randint(2, vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for row in range(1, args.batch, 2):
        mask[row, :min(row, args.prompt_len - 1)] = 0          # left padding on every other row
    # NOTE: with --dp, replica 0 is simulated with its rows (the others: the same on their own chips).
    ids, mask = ids[:args.batch // args.dp], mask[:args.batch // args.dp]
    gen = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
    if args.cache == "static":
        gen["cache_implementation"] = "static"
    if args.kernels == "fused":
        fuse_norms(model)
    expect = None
    if args.check:
        with torch.no_grad():
            expect = ref.generate(ids, attention_mask=mask, **gen, output_logits=True, return_dict_in_generate=True)
    with data():
        if args.ep or args.pp:
            model.to("ahbm")
            place_tp(model)
            plan, where = parallel_plan(args, model), None
        else:
            plan, where = place_plan(model, args.tp, args.dp)
        with kbtorch.home(where) if where else nullcontext():
            check_cache_fits(model, args.batch // args.dp, args.prompt_len + args.new_tokens)
    clock = StepClock(model, plan, where)
    if graph:
        kbtorch.graphed(model)
    with data(), torch.no_grad(), kbtorch.profile() as prof, kbtorch.home(where) if where else nullcontext():
        out = model.generate(ids.to("ahbm"), attention_mask=mask.to("ahbm"), **gen, output_logits=args.check,
                             return_dict_in_generate=True)
    return prof, clock, out, expect, model


def step_bytes(model, batch: int, context: int) -> int:
    """HBM bytes a decode step reads: every weight once but the embedding (of an MoE's
    experts, those its tokens are routed to: at most ``batch x experts_per_tok`` of them, as
    the weights of a fraction of the experts) and the KV cache of ``context`` positions."""
    cfg = model.config
    experts = (getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
               or getattr(cfg, "n_routed_experts", None))
    share = min(1.0, batch * cfg.num_experts_per_tok / experts) if experts else 1.0
    weights = sum(p.numel() * p.element_size() * (share if ".experts." in n else 1.0)
                  for n, p in model.named_parameters() if "embed_tokens" not in n)
    kv = sum(nbytes for _, _, nbytes in kv_cache(cfg, batch, context, next(model.parameters()).element_size()))
    return round(weights) + kv


#: atol of the logits against CPU, by the weights' dtype (--check runs in float32).
LOGIT_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2}


def compare(out, expect) -> dict:
    """``--check``: the greedy tokens and every step's logits on ahbm against CPU."""
    got, want = torch.stack([t.cpu() for t in out.logits]), torch.stack(expect.logits)
    diff = (got - want).abs().max().item()
    tol = LOGIT_TOLERANCE[want.dtype]
    same = bool(torch.equal(out.sequences.cpu(), expect.sequences))
    return {"tokens_match_cpu": same, "max_abs_logit_diff": diff, "logit_tolerance": tol,
            "matches_cpu": same and diff <= tol}


def report(args, prof, clock, out, expect, model, wall: float) -> dict:
    machine = kbtorch.current_machine()
    peak = machine.hbm_gbps(clock.where.pes if clock.where else range(len(machine.pes)))
    prefill, decode = clock.steps[0], clock.steps[1:]
    steps = []
    for i, ns in enumerate(decode):
        moved = step_bytes(model, args.batch // args.dp, args.prompt_len + i + 1)
        steps.append({"context": args.prompt_len + i + 1, "ns": ns, "hbm_bytes": moved,
                      "pct_hbm_roofline": 100 * moved / ns / peak})
    tpot = sum(decode) / len(decode) if decode else None
    total = sum(clock.steps)
    recorded = sum(r.latency_ns for r in prof.records)
    moved = sum(r.latency_ns for r in prof.records if r.name.startswith("redistribute"))
    rec = {"model": args.model, "plan": clock.plan, "dp": args.dp, "batch": args.batch, "prompt_len": args.prompt_len,
           "new_tokens": args.new_tokens, "cache": args.cache, "kernels": args.kernels,
           "timing_only": args.timing_only, "ttft_ns": prefill,
           "tpot_ns": tpot, "decode_steps": steps,
           "tokens_per_s": args.batch * args.new_tokens * 1e9 / total if total else None,
           "decode_tokens_per_s": args.batch * 1e9 / tpot if tpot else None, "total_ns": total,
           "collective_share": moved / recorded if recorded else 0.0,
           "host_ns": prof.host_ns,
           "ops": [{"name": r.name, "latency_ns": r.latency_ns, "bottleneck": r.bottleneck}
                   for r in sorted((r for r in prof.records if r.module), key=lambda r: -r.latency_ns)[:20]]}
    if expect is not None:
        rec.update(compare(out, expect))
    graphs = getattr(model.forward, "graphs", None)
    rec["mode"] = "graph" if graphs else "eager"
    if graphs:
        rec["graphs"] = dict(graphs)
    rec["hbm_peak_bytes"] = kbtorch.hbm_peaks()
    rec["fidelity"] = kbtorch.current_fidelity()
    rec["obtained"] = prof.obtained()
    rec["wall_s"] = wall
    return rec


def obtained_text(rec: dict) -> str:
    """How the figures were obtained (``Profile.obtained``), in one line."""
    o = rec["obtained"]
    ops = ", ".join(f"{n} {m}" for m, n in sorted(o["ops_by_method"].items()))
    return (f"obtained (fidelity {rec['fidelity']}): ops {ops}; over {o['runs']} distinct runs "
            f"{o['events_simulated']:,} events simulated, {o['events_skipped']:,} skipped, "
            f"largest claimed error {100 * o['error_bound']:.3f}%")


def hbm_text(peaks: dict) -> str:
    """Each chip's peak modelled HBM (its fullest HBM node), chips of one peak together."""
    groups: dict = {}
    for chip, nbytes in sorted(peaks.items()):
        groups.setdefault(nbytes, []).append(chip)
    parts = [f"chip{'s' if len(c) > 1 else ''} {c[0]}{f'-{c[-1]}' if len(c) > 1 else ''}: {_size(b)}"
             for b, c in groups.items()]
    return "peak modelled HBM per chip (fullest HBM node): " + "; ".join(parts)


def _size(nbytes: int) -> str:
    scale, unit = next(((s, u) for s, u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")) if nbytes >= s), (1, "bytes"))
    return f"{nbytes / scale:.2f} {unit}" if scale > 1 else f"{nbytes} bytes"


def steps_text(steps: list) -> list:
    """The decode steps: each of up to 3, else the first, the last and the mean."""
    line = "  decode step, context {context}: {us:.1f} us, {pct:.1f}% of the HBM roofline"
    rows = [(str(s["context"]), s["ns"], s["pct_hbm_roofline"]) for s in steps]
    if len(rows) > 3:
        mean = (f"{rows[0][0]}-{rows[-1][0]} (mean of {len(rows)})", sum(r[1] for r in rows) / len(rows),
                sum(r[2] for r in rows) / len(rows))
        rows = [rows[0], rows[-1], mean]
    return [line.format(context=c, us=ns / 1e3, pct=pct) for c, ns, pct in rows]


def both(args) -> int:
    """Eager and graph mode side by side (``--mode both``)."""
    recs = {}
    for mode in ("eager", "graph"):
        t0 = time.perf_counter()
        recs[mode] = report(args, *run(args, graph=mode == "graph"), time.perf_counter() - t0)
    if args.json:
        print(json.dumps(recs))
    else:
        print(f"{args.model}, batch {args.batch}, prompt {args.prompt_len}, {args.new_tokens} new tokens, "
              f"{args.cache} cache")
        print(f"{'':28}{'eager':>14}{'graph':>14}")
        rows = [("time to first token (us)", "ttft_ns", 1e-3), ("time per output token (us)", "tpot_ns", 1e-3),
                ("decode tokens/s", "decode_tokens_per_s", 1), ("wall (s)", "wall_s", 1)]
        for label, key, scale in rows:
            if recs["eager"].get(key) is not None:
                print(f"{label:28}{recs['eager'][key] * scale:14.1f}{recs['graph'][key] * scale:14.1f}")
        last = [recs[m]["decode_steps"][-1]["pct_hbm_roofline"] if recs[m]["decode_steps"] else 0.0
                for m in ("eager", "graph")]
        print(f"{'last step, % HBM roofline':28}{last[0]:14.1f}{last[1]:14.1f}")
        for mode in ("eager", "graph"):
            print(f"{mode}: {hbm_text(recs[mode]['hbm_peak_bytes'])}")
            print(f"{mode}: {obtained_text(recs[mode])}")
    return 0 if all(r.get("matches_cpu", True) for r in recs.values()) else 1


def main(argv=None) -> int:
    args = parse(argv)
    if args.topology:
        try:
            kbtorch.use(args.topology)
        except ValueError as exc:
            raise ValueError(f"argument --topology: {exc}") from None
    kbtorch.current_machine()       # NOTE: a bad --topology or $KBTORCH_TOPOLOGY is refused before the model is built
    bound(args)
    check_plan(args)
    with kbtorch.use_fidelity(args.fidelity) if args.fidelity else nullcontext():
        return both(args) if args.mode == "both" else one(args)


def one(args) -> int:
    """One mode (``--mode eager`` or ``graph``): the profile's table and the figures."""
    t0 = time.perf_counter()
    prof, clock, out, expect, model = run(args, graph=args.mode == "graph")
    rec = report(args, prof, clock, out, expect, model, time.perf_counter() - t0)
    ok = rec.get("matches_cpu", True)
    if args.json:
        print(json.dumps(rec))
        return 0 if ok else 1
    print(prof.key_averages().table(sort_by="latency_ns", row_limit=15))
    print(f"\n{args.model}, batch {args.batch}, prompt {args.prompt_len}, {args.new_tokens} new tokens, "
          f"{args.cache} cache, {args.kernels} norms ({'timing only' if args.timing_only else 'with data'}, "
          f"{rec['wall_s']:.1f} s wall)")
    print(f"plan on {kbtorch.current_machine().name}: {rec['plan']}")
    print(f"time to first token (prefill): {rec['ttft_ns'] / 1e3:.1f} us")
    print("\n".join(steps_text(rec["decode_steps"])))
    print(f"collectives (redistributions): {100 * rec['collective_share']:.1f}% of the recorded kernel time")
    if rec["tpot_ns"]:
        print(f"time per output token: {rec['tpot_ns'] / 1e3:.1f} us = {rec['decode_tokens_per_s']:.0f} tokens/s "
              f"(batch {args.batch}); {rec['tokens_per_s']:.0f} tokens/s over the whole generate()")
    print(hbm_text(rec["hbm_peak_bytes"]))
    if rec.get("graphs"):
        print(f"graph mode: {rec['graphs']['calls']} forward calls, {rec['graphs']['simulated']} graphs simulated, "
              f"{rec['graphs']['retimed']} re-timed from a like graph (the others replayed their timing; "
              f"{rec['graphs']['replayed']} static steps without host work)")
    print(obtained_text(rec))
    if expect is not None:
        print(f"against CPU: greedy tokens match: {rec['tokens_match_cpu']}; max abs logit difference "
              f"{rec['max_abs_logit_diff']:.3g} (tolerance {rec['logit_tolerance']:.3g})")
        if not ok:
            print(f"error: {args.model} on ahbm differs from CPU beyond the tolerance", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_script(main))
