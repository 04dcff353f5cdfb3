"""The table of figures of record: 23 commands (CLI benches, examples, Chrome traces) whose
output must stay byte-identical across a restructuring (issue 41).

    python benchmarks/figures.py run OUT_DIR [--src CHECKOUT]   # run every command, save outputs
    python benchmarks/figures.py compare BEFORE_DIR AFTER_DIR   # one line a command: same / differs

Wall-clock fields (``wall_s``, ``total_wall_s``, ...) are dropped before comparing; every other
byte of stdout and of each written trace must match. Run ``run`` at the commit before a
change (``--src`` a worktree of it) and after it, on the same host.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

K = ["-m", "kbtorch"]
#: (name, argv after the interpreter, trace file or None)
COMMANDS = (
    ("transfer", K + "bench transfer --src 0 --dst 255 --bytes 1MiB --json".split(), None),
    ("hbm", K + "bench hbm --pes 0-7 --bytes 1MiB --pattern hot-channel --json".split(), None),
    ("traffic", K + "bench traffic --pattern transpose --messages 256 --bytes 64KiB --seed 1 --json".split(), None),
    ("gemm_ahbm", K + "bench gemm --m 2048 --n 3584 --k 3584 --json --trace".split(), "gemm"),
    ("gemm_64pe", K + "bench gemm --m 4096 --n 4096 --k 4096 --pes 0-63 --json".split(), None),
    ("gemm_maia_fp8", K + "bench gemm --m 1024 --n 1024 --k 1024 --dtype fp8_e4m3 --topology maia200 --json".split(),
     None),
    ("allreduce_ring", K + "bench allreduce --bytes 16MiB --group cube --algo ring --json".split(), None),
    ("allreduce_auto", K + "bench allreduce --bytes 1KiB --group sip --json".split(), None),
    ("reducescatter_2d", K + "bench reducescatter --bytes 64KiB --group 0-3,8-11 --algo 2d --check --json".split(),
     None),
    ("allgather_torus", K + "bench allgather --bytes 12KiB --group 0,8,16,24,32,40 --topology torus6 --json".split(),
     None),
    ("broadcast_tree", K + "bench broadcast --bytes 1MiB --group cube --root 3 --algo tree --json".split(), None),
    ("attention", K + "bench attention --hq 28 --hkv 4 --lq 1 --lk 4096 --dtype bf16 --json".split(), None),
    ("vector", K + "bench vector --op silu --n 1048576 --json --trace".split(), "vector"),
    ("allreduce_chips", K + "bench allreduce --bytes 4MiB --group across:chip --topology maia200_x8 --json".split(),
     None),
    ("allgather_chips", K + ("bench allgather --bytes 1MiB --group across:chip --topology maia200_x8 --algo direct "
                             "--json").split(), None),
    ("allreduce_coarse", K + "bench allreduce --bytes 1MiB --group sip --mode coarse --json".split(), None),
    ("qwen_graph", "examples/qwen_layer.py --json --mode graph --trace".split(), "qwen_graph"),
    ("qwen_prefill", "examples/qwen_layer.py --json --seq 32 --trace".split(), "qwen_prefill"),
    ("mlp", "examples/mlp_block.py --json --trace".split(), "mlp"),
    ("hf_tiny", "examples/hf_generate.py --model tiny --mode both --cache static --check --json".split(), None),
    ("hf_system", ("examples/hf_generate.py --model tiny-llama --topology tests/data/tiny_system.toml --mode both "
                   "--json").split(), None),
    ("hf_ep", "examples/hf_generate.py --model tiny-mixtral --topology tests/data/tiny_system.toml --ep 2 --json".split(),
     None),
    ("matmul", "examples/matmul_latency.py --json".split(), None),
)
_WALL = re.compile(rb'"[a-z_]*wall[a-z_]*": [-0-9.e]+,? ?')


def run(out: Path, src: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    for name, argv, trace in COMMANDS:
        argv = argv + [str(out / f"{trace}.trace.json")] if trace else argv
        done = subprocess.run([sys.executable, *argv], cwd=src, env=env, capture_output=True)
        (out / f"{name}.out").write_bytes(done.stdout + f"\nexit {done.returncode}\n".encode())
        print(f"{name:18} exit {done.returncode}", flush=True)


def compare(before: Path, after: Path) -> int:
    differ = 0
    for name in sorted(p.name for p in before.iterdir()):
        a, b = (_WALL.sub(b"", (d / name).read_bytes()) for d in (before, after))
        same = (after / name).exists() and a == b
        differ += not same
        print(f"{name:28} {'same' if same else 'DIFFERS'}")
    print(f"{differ} of {len(list(before.iterdir()))} files differ")
    return 1 if differ else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1])
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = p.parse_args()
    if args.cmd == "run":
        run(args.out, args.src.resolve())
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
