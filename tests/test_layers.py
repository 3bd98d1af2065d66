"""The import rule of docs/architecture.md: the library core imports neither the models nor the
application, and the models never import the application. Read from the sources' import
statements (every one, function-level imports included), so a lazy import cannot hide a loop."""

import ast

import pytest

from tests.inputs import ROOT

CORE = sorted(p for p in (ROOT / "attnmetrics").glob("*.py") if p.name != "__main__.py")
MODELS = sorted((ROOT / "models").glob("*.py"))
APP = sorted((ROOT / "attnmetrics" / "app").glob("*.py"))


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
def test_core_imports_neither_models_nor_app(path):
    names = imported(path)
    assert not _under(names, "attnmetrics.models") | _under(names, "attnmetrics.app"), path.name


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_models_never_import_the_app(path):
    assert not _under(imported(path), "attnmetrics.app"), path.name


def test_layers_found_and_linked():
    assert len(CORE) > 10 and len(MODELS) > 5 and len(APP) > 5
    # folder = import name: attnmetrics.models is the top-level models/ folder, linked in
    assert (ROOT / "attnmetrics" / "models").resolve() == (ROOT / "models").resolve()
    assert (ROOT / "attnmetrics" / "csrc").resolve() == (ROOT / "csrc").resolve()


def test_the_rule_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from attnmetrics.app.cli import main\n")
    assert _under(imported(bad), "attnmetrics.app") == {"attnmetrics.app.cli", "attnmetrics.app.cli.main"}
