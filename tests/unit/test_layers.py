"""The layers import one way (docs/architecture.md): no module imports from a layer above
its own, and nothing but the CLI and the tests imports the composition root."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What each package may import of the project.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "tables": {"core"},
    "agents": {"tables", "core"},
    "api": {"tables", "core"},
    "jobs": {"streams", "tables", "core"},
    "app": {"api", "agents", "tables", "core"},
}


def project_imports(path: Path) -> set[str]:
    """The project's top-level packages a module imports (absolute imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found.update(name.split(".")[0] for name in names if name.split(".")[0] in ALLOWED)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    wrong = {
        str(path.relative_to(ROOT)): sorted(found - ALLOWED[package] - {package})
        for path in sorted((ROOT / package).rglob("*.py"))
        if (found := project_imports(path)) - ALLOWED[package] - {package}
    }
    assert not wrong, f"imports from a layer above: {wrong}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "upward.py"
    module.write_text("from app.main import app\nimport tables.engine\nfrom . import sibling\n")
    assert project_imports(module) == {"app", "tables"}
