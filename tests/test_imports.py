"""The layer order of kbtorch as a test: every import, also inside functions and also named by
string ("kbtorch.cli_gemm:add_parser", "kbtorch.models.qwen2_sweep:layer"), goes from a module
to its own group or to a lower layer, and the module graph is acyclic.

The order (``LAYERS``): units, limits -> topology -> sim -> runtime -> kernel -> ops -> tensor
-> profiler -> kbtorch (the public API) -> sweep | models -> serve -> cli. Inside ``tensor`` and ``ops``
the same rule holds one level down (``INNER``): tensor's placement -> core -> handlers ->
graph -> parallel -> the package; ops' contract -> the op families, none importing another;
and inside the collective family's package one level further down: the request and the
schedule's steps -> the algorithms -> schedules -> the kernel and its models -> build ->
choice -> units -> simulate -> side by side -> the package.
"""
import ast
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (rank, group, module patterns). A module may import its own group and any lower rank; the
#: groups of one rank (sweep, models) do not import each other. Ranks decided from the code:
#: - units, limits (parsing, run-size limits) import nothing of kbtorch and every layer uses
#:   them: rank 0, below the topology.
#: - profiler reports on the tensor stream and the simulator's results: above tensor, below
#:   the public API (``kbtorch.profile``) and the front ends that print its tables.
#: - kbtorch (the package root, exactly) is the public API: models use it, as users do.
#: - sweep and models are front ends side by side; a sweep names a model's workload only in
#:   its study file (``fn = "module:function"``), never in code.
#: - cli is the top: ``kbtorch sweep`` drives sweeps, ``kbtorch bench`` every op family;
#:   ``python -m kbtorch`` (``kbtorch.__main__``) is the same command.
#: - models (``kbtorch/models/``) use kbtorch as a user does: through the public API (the
#:   package root) only (``PUBLIC_ONLY``).
#: - serve (``kbtorch/serve/``) drives models: above them, below the cli (``kbtorch serve``);
#:   like models it sees kbtorch through the public API only, and models.
LAYERS = (
    (0, "base", ("kbtorch.units", "kbtorch.limits", "kbtorch.state")),
    (1, "topology", ("kbtorch.topology",)),
    (2, "sim", ("kbtorch.sim",)),
    (3, "runtime", ("kbtorch.runtime",)),
    (4, "kernel", ("kbtorch.kernel",)),
    (5, "ops", ("kbtorch.ops",)),
    (6, "tensor", ("kbtorch.tensor",)),
    (7, "profiler", ("kbtorch.profiler",)),
    (8, "api", ("kbtorch",)),
    (9, "sweep", ("kbtorch.sweep",)),
    (9, "models", ("kbtorch.models",)),
    (10, "serve", ("kbtorch.serve",)),
    (11, "cli", ("kbtorch.cli", "kbtorch.cli_*", "kbtorch.__main__")),
)

#: the group of the op families: each family its own group (``_rank``).
FAMILY = "<family>"

#: The order inside a layer's package, as ``LAYERS`` one level down: a module imports its own
#: group and lower ranks; ``package`` (the package root alone) imports all of them. A group
#: with a table of its own (``"ops.collective"``: the group ``collective`` of ``ops``) has
#: that order inside it, one level further down.
#: - tensor: placements and meshes are data; the core (the stream, dispatch and its timing
#:   records, HBM books, tensors and redistribution, the device) runs one op; handlers are
#:   the ops; graph mode times many ops as one graph; parallel plans use all of it.
#: - ops: the op contract and layouts; each family (one per prefix or package) is its own
#:   group, so no family imports another.
#: - ops.collective: what a collective is asked (the request, the schedule's steps); the
#:   algorithms build steps; schedules and groups; the kernel, its buffers and multicast
#:   grouping, the renaming of a line's programs; the kernel's models; building a kernel;
#:   choosing an algorithm (it builds candidates); collectives across units (they choose);
#:   one collective simulated; groups side by side (they simulate one group as one).
INNER = {
    "tensor": (
        (0, "placement", ("kbtorch.tensor.placement",)),
        (1, "core", tuple(f"kbtorch.tensor.{m}" for m in
                          ("device", "dispatch", "hbm", "module", "redistribute", "stream", "tensor", "timing"))),
        (2, "handlers", ("kbtorch.tensor.handlers",)),
        (3, "graph", ("kbtorch.tensor.graph",)),
        (4, "parallel", ("kbtorch.tensor.parallel",)),
        (5, "package", ("kbtorch.tensor",)),
    ),
    "ops": (
        (0, "contract", ("kbtorch.ops.contract", "kbtorch.ops.layout")),
        (1, FAMILY, ("kbtorch.ops.*",)),
        (2, "package", ("kbtorch.ops",)),
    ),
    "ops.collective": (
        (0, "request", tuple(f"kbtorch.ops.collective.{m}" for m in ("request", "steps"))),
        (1, "algorithms", ("kbtorch.ops.collective.algorithms",)),
        (2, "schedules", tuple(f"kbtorch.ops.collective.{m}" for m in ("groups", "schedules"))),
        (3, "kernel", tuple(f"kbtorch.ops.collective.{m}" for m in ("kernel_layout", "multicast", "rename"))),
        (4, "models", tuple(f"kbtorch.ops.collective.{m}" for m in ("analytic", "kernel"))),
        (5, "build", ("kbtorch.ops.collective.build",)),
        (6, "choice", ("kbtorch.ops.collective.choice",)),
        (7, "units", ("kbtorch.ops.collective.units",)),
        (8, "simulate", ("kbtorch.ops.collective.simulate",)),
        (9, "side_by_side", ("kbtorch.ops.collective.side_by_side",)),
        (10, "package", ("kbtorch.ops.collective",)),
    ),
}

#: Groups that import the rest of kbtorch through the public API (``kbtorch``) only, and the
#: groups named beside them.
PUBLIC_ONLY = {"models": (), "serve": ("models",)}
#: The groups that import ``kbtorch.sim`` itself; every layer above reaches it through
#: ``kbtorch.kernel.door`` (issue 42: one door to the simulator).
BEHIND_DOOR = ("sim", "runtime", "kernel")


#: A string constant read as an import: ``package.module`` or ``module:function`` under one of
#: our top packages (a bare ``"kbtorch"`` is a name, e.g. an op label, not an import).
_BY_STRING = re.compile(r"^kbtorch(?:\.\w+)*(?::\w+)?$")


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _files(root: Path) -> list:
    return sorted((root / "kbtorch").rglob("*.py"))


def _imports(path: Path, modules: set, root: Path = ROOT) -> dict:
    """Every module ``path`` imports (absolute names), anywhere in its body -> how ("import"
    or "string")."""
    name = _name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update({alias.name: "import" for alias in node.names})
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = ".".join(p for p in (base if node.level else "", node.module or "") if p)
            out[target] = "import"
            out.update({f"{target}.{a.name}": "import" for a in node.names if f"{target}.{a.name}" in modules})
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _BY_STRING.match(node.value):
            if "." in node.value or ":" in node.value:
                out.setdefault(node.value.partition(":")[0], "string")
    return out


def _graph(root: Path = ROOT) -> dict:
    """module -> {imported module: "import" | "string"}, over kbtorch/ under root."""
    files = _files(root)
    modules = {_name(f, root) for f in files}
    graph = {}
    for f in files:
        me = _name(f, root)
        found = _imports(f, modules, root)
        # NOTE: importing a module runs the packages above it first: those count too, except a
        # module's own ancestors (a parent package importing its child is how packages are built).
        for m, how in list(found.items()):
            for i in range(1, m.count(".") + 1):
                found.setdefault(".".join(m.split(".")[:i]), how)
        graph[me] = {m: how for m, how in found.items() if m.split(".")[0] == "kbtorch"
                     and m != me and not me.startswith(m + ".") and not m.startswith(me + ".")
                     and (m in modules or how == "string")}
    return graph


def _matches(module: str, pattern: str, exact: bool = False) -> bool:
    """``pattern`` names ``module`` or a package above it (``exact``: ``module`` alone)."""
    if exact:
        return module == pattern
    return fnmatch.fnmatchcase(".".join(module.split(".")[:pattern.count(".") + 1]), pattern)


def _rank(module: str, table: tuple) -> tuple | None:
    """(rank, group) of a module in ``table``: its most specific pattern (None: unranked).
    The groups ``api`` and ``package`` name their package root alone."""
    found = [(len(p), rank, group) for rank, group, patterns in table for p in patterns
             if _matches(module, p, group in ("api", "package"))]
    if not found:
        return None
    rank, group = max(found)[1:]
    # NOTE: an op family is its files, named by their first word (gemm, gemm_plan, ...), or a package.
    return rank, module.split(".")[2].split("_")[0] if group == FAMILY else group


def _layer(module: str) -> tuple | None:
    """(rank, group) of a module in ``LAYERS``."""
    return _rank(module, LAYERS)


def _against(me: str, mine: tuple, m: str, theirs: tuple | None, how: str, where: str = "") -> list:
    """The line for an import of ``m`` by ``me`` against the order (``[]`` if it follows it)."""
    if theirs is None or theirs[1] != mine[1] and theirs[0] >= mine[0]:
        them = "unranked" if theirs is None else f"{where}{theirs[1]}, rank {theirs[0]}"
        return [f"{me} ({where}{mine[1]}, rank {mine[0]}) imports {m} ({them})" + (" by string" if how == "string" else "")]
    return []


def _unplaced(me: str, key: str) -> list:
    """The line for a module with no place in ``INNER[key]`` or in a table below it."""
    table = INNER.get(key)
    if table is None:
        return []
    found = _rank(me, table)
    if found is None:
        return [f"{me} has no place in {key}: give it a rank in INNER[{key!r}]"]
    return _unplaced(me, f"{key}.{found[1]}")


def _inner(me: str, m: str, how: str, key: str) -> list:
    """The line for an import inside group ``key`` against ``INNER[key]``, one level further
    down where both modules are of one group with a table of its own."""
    mine, theirs = _rank(me, INNER[key]), _rank(m, INNER[key])
    if theirs == mine and f"{key}.{mine[1]}" in INNER:
        return _inner(me, m, how, f"{key}.{mine[1]}")
    return _against(me, mine, m, theirs, how, f"{key}: ")


def violations(graph: dict) -> list:
    """Every import against the order (``LAYERS``, and ``INNER`` inside a group), as readable
    lines; unranked modules too."""
    out = []
    for me in sorted(graph):
        mine = _layer(me)
        if mine is None:
            out.append(f"{me} has no layer: give it a rank in LAYERS")
            continue
        inner = INNER.get(mine[1])
        unplaced = _unplaced(me, mine[1])
        if unplaced:
            out += unplaced
            continue
        for m, how in sorted(graph[me].items()):
            theirs = _layer(m)
            if theirs is None and how == "import":
                continue
            if theirs is not None and theirs[1] == "sim" and mine[1] not in BEHIND_DOOR:
                out.append(f"{me} ({mine[1]}) imports {m}: above the kernel, the simulator is reached through "
                           f"kbtorch.kernel.door only")
            elif mine[1] in PUBLIC_ONLY and theirs is not None and theirs[1] not in (mine[1], "api", *PUBLIC_ONLY[mine[1]]):
                also = "".join(f" and {g}" for g in PUBLIC_ONLY[mine[1]])
                out.append(f"{me} ({mine[1]}) imports {m}: {mine[1]} use the public API (kbtorch){also} only")
            elif inner and theirs == mine:
                out += _inner(me, m, how, mine[1])
            else:
                out += _against(me, mine, m, theirs, how)
    return out


def _cycle(graph: dict) -> list | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and n in graph:
                found = visit(n)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None
    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_module_graph_has_no_cycle():
    graph = _graph()
    assert "kbtorch.tensor.dispatch" in graph and graph["kbtorch.tensor.tensor"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_every_import_follows_the_layer_order():
    graph = _graph()
    assert not violations(graph), "\n".join(violations(graph))


def test_every_module_has_a_layer():
    assert _layer("kbtorch") == (8, "api") and _layer("kbtorch.cli_gemm") == (11, "cli")
    assert _layer("kbtorch.serve.loop") == (10, "serve")
    assert _layer("kbtorch.models.qwen2") == (9, "models") and _layer("kbtorch.units") == (0, "base")
    assert _layer("kbtorch.tensor.handlers.matmul") == _layer("kbtorch.tensor.graph.compile") == (6, "tensor")
    assert _layer("kbtorch.nowhere") is None and _layer("models.hf") is None


def test_every_module_of_tensor_and_ops_has_a_place():
    tensor, ops = INNER["tensor"], INNER["ops"]
    assert _rank("kbtorch.tensor.placement.mesh", tensor) == (0, "placement")
    assert _rank("kbtorch.tensor.dispatch", tensor) == (1, "core")
    assert _rank("kbtorch.tensor.handlers.matmul_mesh", tensor) == (2, "handlers")
    assert _rank("kbtorch.tensor.graph.compile", tensor) == (3, "graph")
    assert _rank("kbtorch.tensor.parallel.plan", tensor) == (4, "parallel")
    assert _rank("kbtorch.tensor", tensor) == (5, "package") and _rank("kbtorch.tensor.other", tensor) is None
    assert _rank("kbtorch.ops.gemm_kernel", ops) == (1, "gemm") and _rank("kbtorch.ops.layout", ops) == (0, "contract")
    collective = INNER["ops.collective"]
    assert _rank("kbtorch.ops.collective.algorithms.ring", ops) == (1, "collective")
    assert _rank("kbtorch.ops.collective.algorithms.ring", collective) == (1, "algorithms")
    assert _rank("kbtorch.ops.collective", collective) == (10, "package")
    graph = _graph()
    for group, table in INNER.items():
        root = f"kbtorch.{group}"
        assert all(_rank(m, table) for m in graph if m == root or m.startswith(root + ".")), group


def _plant(root: Path, files: dict) -> dict:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _graph(root)


def test_a_planted_back_import_fails(tmp_path):
    """A module tree with ops importing tensor (inside a function), ops naming a CLI module
    by string, a sweep naming a model by string and a model past the public API: the
    checker reports each, by name."""
    graph = _plant(tmp_path, {
        "kbtorch/__init__.py": "", "kbtorch/tensor/__init__.py": "", "kbtorch/tensor/timing.py": "",
        "kbtorch/ops/__init__.py": "",
        "kbtorch/ops/contract.py": "from ..sim import engine\nfrom .. import limits\nLABEL = 'kbtorch'\n",
        "kbtorch/ops/gemm.py": "def f():\n    from ..tensor.timing import run\n    return run\n",
        "kbtorch/ops/vector.py": "CLI = 'kbtorch.cli_x:add_parser'\n",
        "kbtorch/models/__init__.py": "", "kbtorch/models/m.py": "import kbtorch\n",
        "kbtorch/models/deep.py": "from kbtorch.tensor.timing import run\n",
        "kbtorch/sweep/__init__.py": "", "kbtorch/sweep/w.py": "BUILTIN = {'layer': 'kbtorch.models.m:layer'}\n",
        "kbtorch/serve/__init__.py": "", "kbtorch/serve/s.py": "import kbtorch\nfrom kbtorch.models import m\n",
        "kbtorch/serve/deep.py": "from kbtorch.tensor.timing import run\n"})
    found = violations(graph)
    assert found == [
        "kbtorch.models.deep (models) imports kbtorch.tensor: models use the public API (kbtorch) only",
        "kbtorch.models.deep (models) imports kbtorch.tensor.timing: models use the public API (kbtorch) only",
        "kbtorch.ops.gemm (ops, rank 5) imports kbtorch.tensor (tensor, rank 6)",
        "kbtorch.ops.gemm (ops, rank 5) imports kbtorch.tensor.timing (tensor, rank 6)",
        "kbtorch.ops.vector (ops, rank 5) imports kbtorch.cli_x (cli, rank 11) by string",
        "kbtorch.serve.deep (serve) imports kbtorch.tensor: serve use the public API (kbtorch) and models only",
        "kbtorch.serve.deep (serve) imports kbtorch.tensor.timing: serve use the public API (kbtorch) and models only",
        "kbtorch.sweep.w (sweep, rank 9) imports kbtorch.models (models, rank 9) by string",
        "kbtorch.sweep.w (sweep, rank 9) imports kbtorch.models.m (models, rank 9) by string"], found


def test_a_planted_back_import_inside_tensor_and_ops_fails(tmp_path):
    """The core importing a handler, a family importing another and a module with no place
    in its layer's order: each reported, by name."""
    graph = _plant(tmp_path, {
        "kbtorch/__init__.py": "", "kbtorch/tensor/__init__.py": "from .handlers import copy\n",
        "kbtorch/tensor/dispatch.py": "from .handlers.copy import timed_copy\n",
        "kbtorch/tensor/handlers/__init__.py": "", "kbtorch/tensor/handlers/copy.py": "from ..dispatch import x\n",
        "kbtorch/tensor/extra.py": "", "kbtorch/ops/__init__.py": "",
        "kbtorch/ops/gemm.py": "from .attention import run\n", "kbtorch/ops/attention.py": "from .contract import y\n",
        "kbtorch/ops/contract.py": ""})
    found = violations(graph)
    assert found == [
        "kbtorch.ops.gemm (ops: gemm, rank 1) imports kbtorch.ops.attention (ops: attention, rank 1)",
        "kbtorch.tensor.dispatch (tensor: core, rank 1) imports kbtorch.tensor.handlers (tensor: handlers, rank 2)",
        "kbtorch.tensor.dispatch (tensor: core, rank 1) imports kbtorch.tensor.handlers.copy (tensor: handlers, rank 2)",
        "kbtorch.tensor.extra has no place in tensor: give it a rank in INNER['tensor']"], found
    assert _cycle(graph) == ["kbtorch.tensor.dispatch", "kbtorch.tensor.handlers.copy", "kbtorch.tensor.dispatch"]


def test_a_planted_cycle_and_an_unranked_module_fail(tmp_path):
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    graph = _plant(tmp_path, {"kbtorch/__init__.py": "", "kbtorch/extra.py": "X = 1\n"})
    assert violations(graph) == ["kbtorch.extra has no layer: give it a rank in LAYERS"]


def test_the_walk_sees_imports_inside_functions():
    modules = {_name(f, ROOT) for f in _files(ROOT)}
    found = _imports(ROOT / "kbtorch" / "tensor" / "handlers" / "matmul.py", modules)
    assert found.get("kbtorch.ops.gemm") == "import" and "kbtorch.tensor.dispatch" in found


def test_a_planted_back_import_inside_the_collective_package_fails(tmp_path):
    """Inside ``ops/collective/``: the request importing the choice, an algorithm importing
    the kernel, a module with no place in the package's order; the package root importing
    everything is in order."""
    graph = _plant(tmp_path, {
        "kbtorch/__init__.py": "", "kbtorch/ops/__init__.py": "", "kbtorch/ops/contract.py": "",
        "kbtorch/ops/collective/__init__.py": "from .choice import choose\nfrom .algorithms import ring\n",
        "kbtorch/ops/collective/request.py": "from ..contract import x\nfrom .choice import choose\n",
        "kbtorch/ops/collective/choice.py": "from .request import Request\n",
        "kbtorch/ops/collective/kernel.py": "from .steps import Xfer\n", "kbtorch/ops/collective/steps.py": "",
        "kbtorch/ops/collective/algorithms/__init__.py": "",
        "kbtorch/ops/collective/algorithms/ring.py": "from ..steps import Xfer\nfrom ..kernel import k\n",
        "kbtorch/ops/collective/extra.py": ""})
    found = violations(graph)
    assert found == [
        "kbtorch.ops.collective.algorithms.ring (ops.collective: algorithms, rank 1) imports "
        "kbtorch.ops.collective.kernel (ops.collective: models, rank 4)",
        "kbtorch.ops.collective.extra has no place in ops.collective: give it a rank in INNER['ops.collective']",
        "kbtorch.ops.collective.request (ops.collective: request, rank 0) imports "
        "kbtorch.ops.collective.choice (ops.collective: choice, rank 6)"], found
    assert _cycle(graph) == ["kbtorch.ops.collective.choice", "kbtorch.ops.collective.request",
                             "kbtorch.ops.collective.choice"]


def test_a_planted_import_of_the_simulator_past_the_door_fails(tmp_path):
    """ops and tensor reach sim/ through kbtorch.kernel.door only; runtime and kernel may."""
    graph = _plant(tmp_path, {
        "kbtorch/__init__.py": "", "kbtorch/sim/__init__.py": "", "kbtorch/sim/engine.py": "",
        "kbtorch/runtime/__init__.py": "", "kbtorch/runtime/r.py": "from ..sim import engine\n",
        "kbtorch/kernel/__init__.py": "", "kbtorch/kernel/door.py": "from ..sim.engine import x\n",
        "kbtorch/ops/__init__.py": "", "kbtorch/ops/contract.py": "from ..kernel.door import x\n",
        "kbtorch/tensor/__init__.py": "", "kbtorch/tensor/stream.py": "def f():\n    from ..sim.engine import x\n"})
    found = [v for v in violations(graph) if "door" in v]
    assert found == [f"kbtorch.tensor.stream (tensor) imports {m}: above the kernel, the simulator is reached "
                     "through kbtorch.kernel.door only" for m in ("kbtorch.sim", "kbtorch.sim.engine")], found


#: the most modules a folder of kbtorch holds (the guide: folders of under about 15 modules).
FOLDER_MODULES_MAX = 15


def test_no_folder_holds_more_than_fifteen_modules():
    sizes = {d.relative_to(ROOT).as_posix(): len(list(d.glob("*.py")))
             for d in [ROOT / "kbtorch", *(ROOT / "kbtorch").rglob("*")] if d.is_dir() and d.name != "__pycache__"}
    assert sizes["kbtorch/topology/load"] > 1, sizes
    crowded = {d: n for d, n in sizes.items() if n > FOLDER_MODULES_MAX}
    assert not crowded, f"folders of more than {FOLDER_MODULES_MAX} modules: {crowded}"
