"""The import rule of docs/architecture.md: the library core imports neither the data, the models
nor the application; the data import neither the models nor the application; the models never
import the application. Read from the sources' import
statements (every one, function-level imports included), so a lazy import cannot hide a loop."""

import ast

import pytest

from tests.inputs import ROOT

CORE = sorted(
    p
    for p in [
        *(ROOT / "attnmetrics").glob("*.py"),
        *(ROOT / "attnmetrics" / "testing").glob("*.py"),
        *(ROOT / "attnmetrics" / "llm").glob("*.py"),
        *(ROOT / "attnmetrics" / "attributions").glob("*.py"),
    ]
    if p.name != "__main__.py"
)
DATA = sorted((ROOT / "attnmetrics" / "data").rglob("*.py"))
MODELS = sorted((ROOT / "models").glob("*.py"))
APP = sorted((ROOT / "attnmetrics" / "app").rglob("*.py"))


def imported(path) -> set[str]:
    """Every module a file imports (absolute names; relative imports resolved against its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import; the project imports absolutely"
            names.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
    return names


def _under(names: set[str], package: str) -> set[str]:
    return {n for n in names if n == package or n.startswith(package + ".")}


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_imports_neither_data_models_nor_app(path):
    names = imported(path)
    assert (
        not _under(names, "attnmetrics.data") | _under(names, "attnmetrics.models") | _under(names, "attnmetrics.app")
    ), path.name


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.name)
def test_data_import_neither_models_nor_app(path):
    """The data (corpora, vectors, weights) come before any model: the models and the app read them."""
    names = imported(path)
    assert not _under(names, "attnmetrics.models") | _under(names, "attnmetrics.app"), path.name


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_models_never_import_the_app(path):
    assert not _under(imported(path), "attnmetrics.app"), path.name


def test_layers_found_and_linked():
    assert len(CORE) > 10 and len(DATA) > 5 and len(MODELS) > 5 and len(APP) > 5
    # folder = import name: attnmetrics.models is the top-level models/ folder, linked in
    assert (ROOT / "attnmetrics" / "models").resolve() == (ROOT / "models").resolve()
    assert (ROOT / "attnmetrics" / "csrc").resolve() == (ROOT / "csrc").resolve()


def test_the_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from attnmetrics.app.cli import main\n")
    assert _under(imported(bad), "attnmetrics.app") == {"attnmetrics.app.cli", "attnmetrics.app.cli.main"}


def module_graph() -> dict[str, set[str]]:
    """Every module of the package (models/ as attnmetrics.models) -> the package's modules it
    imports, at module level or inside functions. An import of an enclosing package is left out:
    Python runs a package's __init__ before any of its modules, so it cannot close a loop."""
    files = {}
    for path in [*(ROOT / "attnmetrics").rglob("*.py"), *(ROOT / "models").glob("*.py")]:
        relative = path.relative_to(ROOT).with_suffix("")
        if relative.parts[:2] in (("attnmetrics", "models"), ("attnmetrics", "csrc")):
            continue  # the links to models/ and csrc/
        parts = ["attnmetrics", *relative.parts] if relative.parts[0] == "models" else list(relative.parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in files.items():
        deps = set()
        for name in imported(path):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                deps.add(name)
        graph[module] = deps
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops: strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_loop():
    graph = module_graph()
    assert {"attnmetrics.app.sweep.runner", "attnmetrics.data", "attnmetrics.data.corpora", "attnmetrics.loo"} <= set(
        graph
    )
    assert loops(graph) == []


def test_the_loop_check_finds_a_loop():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages (the links to models/ and csrc/ rule out discovery): a
    package folder left out would work in an editable install and be missing from a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "attnmetrics").rglob("__init__.py")
        if not p.parent.relative_to(ROOT / "attnmetrics").parts[:1] == ("models",)
    }
    assert folders <= listed, sorted(folders - listed)
    assert {"attnmetrics.models", "attnmetrics.csrc"} <= listed
