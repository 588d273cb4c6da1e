"""The modules of python/mpicomp import one another without a cycle, and none reaches into
another's private names: the layers of DESIGN.md, read from the source (every import,
those inside functions too, since a deferred import only hides a cycle)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "python"
PACKAGE = ROOT / "mpicomp"


def _modules():
    """{dotted name: path} of every module of the package (extensions excepted)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name, path, modules):
    """(module imported, names taken from it) for each import statement of one module, and
    for each ``alias._name`` read from a module imported as alias; a module imported through
    ``from package import module`` counts as that module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "mpicomp":
                    aliases[a.asname or a.name] = a.name
                    yield a.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != "mpicomp":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in modules or a.name == "_core":  # _core: the C++ extension, a leaf
                    aliases[a.asname or a.name] = sub
                    yield sub, ()
                else:
                    yield base, (a.name,)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield aliases[node.value.id], (node.attr,)


def _graph():
    modules = _modules()
    edges, private = {}, []
    for name, path in modules.items():
        edges[name] = set()
        for target, names in _imports(name, path, modules):
            if target in modules and target != name:
                edges[name].add(target)
            private += sorted({f"{name} imports {target}.{n}" for n in names if n.startswith("_") and not
                               n.startswith("__") and target in modules and n != "_core" and f"{target}.{n}" not in modules})
    return edges, private


def _cycle(edges):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == "open":
                return stack[stack.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_reader_sees_every_module():
    edges, _ = _graph()
    assert {"mpicomp", "mpicomp.collectives", "mpicomp.torch.backend", "mpicomp.optim.amsp.optimizer"} <= set(edges)
    assert "mpicomp.codecs" in edges["mpicomp.collectives"]


def test_no_import_cycle():
    cycle = _cycle(_graph()[0])
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_private_name_taken_across_modules():
    assert _graph()[1] == []


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
