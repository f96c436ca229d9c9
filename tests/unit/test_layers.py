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
    "streams": {"tables", "core"},
    "agents": {"streams", "tables", "core"},
    "api": {"tables", "core"},
    "jobs": {"streams", "tables", "core"},
    "app": {"api", "streams", "tables", "core"},
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


#: What only the faust adapter (tables/faust_adapter.py) may import: faust, the service
#: library it runs on, and the stores' database.
ADAPTED = {"faust", "mode", "rocksdict"}
#: Keys of a partition database that only its store (``FaustTableStore``) names.
STORE_INTERNALS = {"POSITION_KEY"}


def adapted_imports(node: ast.AST) -> list[str]:
    """What ``node`` imports of what only the adapter may import."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
    else:
        names = []
    return [f"{node.lineno}: import {n}" for n in names if n.split(".")[0] in ADAPTED]


def door_breaches(path: Path) -> list[str]:
    """Where a module reaches past the adapter: an import of what only the adapter may
    import or of a store's internal key, or an attribute of another object whose name is
    private (``x._dbs``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        found += adapted_imports(node)
        if isinstance(node, ast.ImportFrom):
            found += [
                f"{node.lineno}: import {alias.name}"
                for alias in node.names
                if alias.name in STORE_INTERNALS
            ]
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_query_layer_reaches_faust_only_through_the_adapter() -> None:
    breaches = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "api").rglob("*.py"))
        if (found := door_breaches(path))
    }
    assert not breaches, f"api/ reaches past tables/membership.py and the stores: {breaches}"


#: The modules of tables/ that may import faust, mode or rocksdict: the adapter, and those
#: that declare faust's tables, sensors, services, restore types and group assignor. The
#: engine, its producers and every other part of the commit cycle are not among them.
FAUST_IN_TABLES = {"faust_adapter.py", "definitions.py", "global_table.py", "rebalances.py"}
FAUST_IN_TABLES |= {"restore.py", "warmups.py"}


def test_the_engine_and_its_parts_import_no_faust() -> None:
    found = {
        str(path.relative_to(ROOT)): imports
        for path in sorted((ROOT / "tables").rglob("*.py"))
        if path.name not in FAUST_IN_TABLES
        and (
            imports := [
                i for n in ast.walk(ast.parse(path.read_text())) for i in adapted_imports(n)
            ]
        )
    }
    assert not found, f"reach faust through tables/faust_adapter.py: {found}"


def test_the_door_check_sees_faust_and_private_attributes(tmp_path: Path) -> None:
    module = tmp_path / "through.py"
    module.write_text(
        "from faust.types import TP\n"
        "import mode\n"
        "def read(table, p):\n"
        "    return table.data._dbs[p]\n"
        "class Own:\n"
        "    def go(self):\n"
        "        return self._mine, x.__dict__\n"
    )
    assert door_breaches(module) == [
        "1: import faust.types",
        "2: import mode",
        "4: table.data._dbs",
    ]


PACKAGES = ("core", "tables", "streams", "agents", "api", "jobs", "app")


def guarantee_decisions(path: Path) -> list[int]:
    """Lines of a module that work out the processing guarantee from its setting
    (a comparison with ``.processing_guarantee``) instead of reading
    ``Settings.exactly_once``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Compare)
        and any(
            isinstance(part, ast.Attribute) and part.attr == "processing_guarantee"
            for part in (node.left, *node.comparators)
        )
    ]


def test_the_processing_guarantee_is_decided_once_in_the_settings() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "core" / "settings.py" and (lines := guarantee_decisions(path))
    }
    assert not found, f"read Settings.exactly_once instead: {found}"


def test_the_guarantee_check_sees_a_comparison(tmp_path: Path) -> None:
    module = tmp_path / "again.py"
    module.write_text(
        "once = settings.exactly_once\n"
        "conf.processing_guarantee = 'at_least_once'\n"
        "eos = settings.processing_guarantee == 'exactly_once'\n"
    )
    assert guarantee_decisions(module) == [3]
