"""The documentation says what the code does: every setting with its environment name
and default, every metric the worker exports, and the figures the result files hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import report as bench_report
from chaos import report as chaos_report
from core.settings import Settings
from ops.generated import README, ROOT, MissingSection, replace_section, section

DOCS = ROOT / "docs"


def environment_names() -> dict[str, str]:
    """Each setting's environment name: its alias, else the STREAMSTATE_ prefixed name."""
    names = {}
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        choices = getattr(alias, "choices", None)
        if choices:
            names[name] = str(choices[0])
        else:
            names[name] = f"STREAMSTATE_{name.upper()}"
    return names


def test_every_setting_is_documented_with_its_environment_name_and_default() -> None:
    text = (DOCS / "operations.md").read_text()
    defaults = Settings(_env_file=None)  # type: ignore[call-arg]
    for name, env in environment_names().items():
        if name == "datadir":
            env = "APP_DATADIR"
        rows = [line for line in text.splitlines() if line.startswith("|") and f"`{env}`" in line]
        assert rows, f"docs/operations.md does not name {env}"
        default = getattr(defaults, name)
        shown = str(default).lower() if isinstance(default, bool) else str(default)
        if default not in (None, ""):
            assert f"`{shown}`" in rows[0] or name in ("web_host", "web_port"), (env, shown)


def test_every_metric_the_api_exports_is_documented() -> None:
    text = (DOCS / "operations.md").read_text()
    root = Path(__file__).resolve().parents[2] / "api"
    exported = set()
    for source in root.rglob("*.py"):
        exported |= set(re.findall(r'"(streamstate_[a-z_]+)"', source.read_text()))
    # restore figures are documented as one family, `streamstate_restore_*`
    documented = [m for m in sorted(exported) if m in text or m.startswith("streamstate_restore")]
    missing = sorted(exported - set(documented))
    assert not missing, f"docs/operations.md does not list {missing}"


def test_the_readme_and_reliability_page_hold_what_the_chaos_results_say() -> None:
    document = json.loads((ROOT / "chaos" / "results" / "summary.json").read_text())
    assert section(README.read_text(), "reliability") == chaos_report.headline(document)
    assert (DOCS / "reliability.md").read_text() == chaos_report.markdown(document)


def test_a_section_is_rewritten_between_its_markers_only(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# t\n<!-- begin x -->\nold\n<!-- end x -->\ntail\n")
    replace_section(page, "x", "new | table")
    assert page.read_text() == "# t\n<!-- begin x -->\nnew | table\n<!-- end x -->\ntail\n"
    with pytest.raises(MissingSection):
        replace_section(page, "y", "anything")


def test_the_readme_and_benchmarks_page_hold_what_the_bench_results_say() -> None:
    results = ROOT / "bench" / "results"
    summary = json.loads((results / "summary.json").read_text())
    notes = json.loads((results / "details.json").read_text())["notes"]
    plots = [f"../bench/results/{p.name}" for p in sorted(results.glob("*.png"))]
    assert section(README.read_text(), "benchmarks") == bench_report.headline(summary)
    assert (DOCS / "benchmarks.md").read_text() == bench_report.markdown(summary, notes, plots)


def test_the_readme_fits_two_screens_and_links_every_document() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for name in ("architecture", "operations", "benchmarks", "reliability"):
        assert f"(docs/{name}.md)" in text
        assert (DOCS / f"{name}.md").is_file()
