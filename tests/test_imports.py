"""The module graph of kbtorch is acyclic (every import, also inside functions), and the
front end (tensor, ops, profiler, cli) never imports simpy."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kbtorch"


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set) -> set:
    """Every module ``path`` imports (absolute names), anywhere in its body."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = ".".join(p for p in (base if node.level else "", node.module or "") if p)
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules)
    return out


def _graph() -> dict:
    files = sorted(PKG.rglob("*.py"))
    modules = {_name(f) for f in files}
    graph = {}
    for f in files:
        me = _name(f)
        found = _imports(f, modules)
        # NOTE: importing a module runs the packages above it first: those count too, except a
        # module's own ancestors (a parent package importing its child is how packages are built).
        found |= {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)}
        graph[me] = {m for m in found if m in modules and m != me and not me.startswith(m + ".")
                     and not m.startswith(me + ".")}
    return graph


def _cycle(graph: dict) -> list | None:
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
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


def test_the_front_end_does_not_import_simpy():
    front = ("kbtorch/tensor/", "kbtorch/ops/", "kbtorch/profiler", "kbtorch/cli")
    for f in sorted(PKG.rglob("*.py")):
        if str(f.relative_to(ROOT)).startswith(front):
            found = {m for m in _imports(f, set()) if m.split(".")[0] == "simpy"}
            assert not found, f"{f.relative_to(ROOT)} imports {found}"


def test_the_walk_sees_imports_inside_functions():
    graph = {"a": {"b"}, "b": {"a"}}
    assert _cycle(graph) == ["a", "b", "a"]
    found = _imports(PKG / "tensor" / "ops_matmul.py", {_name(f) for f in PKG.rglob("*.py")})
    assert "kbtorch.ops.gemm" in found and "kbtorch.tensor.dispatch" in found
