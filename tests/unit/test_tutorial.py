"""The tutorial (docs/tutorial.md) shows its code as it is in docs/tutorial/, and that
code's own tests pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import test_pageviews  # docs/tutorial/ is on the path (tests/conftest.py)

TUTORIAL = Path(__file__).resolve().parents[2] / "docs"


def code_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


@pytest.mark.parametrize("name", ["pageviews.py", "test_pageviews.py"])
def test_the_tutorial_shows_each_file_as_it_is(name: str) -> None:
    text = (TUTORIAL / "tutorial.md").read_text()
    assert (TUTORIAL / "tutorial" / name).read_text() in code_blocks(text)


def test_the_tutorial_names_no_file_it_does_not_have() -> None:
    text = (TUTORIAL / "tutorial.md").read_text()
    assert len(code_blocks(text)) == 2


@pytest.mark.parametrize("name", sorted(n for n in dir(test_pageviews) if n.startswith("test_")))
def test_the_tutorials_own_tests_pass(name: str) -> None:
    getattr(test_pageviews, name)()
