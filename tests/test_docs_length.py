"""The docs stay short enough to read: no page over about 300 lines (a longer one is split by
concept), and the README, which is also the package's long description, under about 200 lines
with the install and the quick start first."""

from __future__ import annotations

import re
from pathlib import Path

from harness import REPO_ROOT

#: Lines a docs page may have; past it, split the page by concept.
PAGE_MAX_LINES = 320
#: Lines the README may have; the rest belongs in docs/.
README_MAX_LINES = 210


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_docs_page_is_longer_than_the_page_limit() -> None:
    pages = sorted((REPO_ROOT / "docs").rglob("*.md"))
    assert len(pages) > 20  # the glob found the site
    long = {str(p.relative_to(REPO_ROOT)): _lines(p) for p in pages if _lines(p) > PAGE_MAX_LINES}
    assert long == {}, f"pages over {PAGE_MAX_LINES} lines, to split by concept: {long}"


def test_the_readme_is_short_and_opens_with_the_install_and_the_quick_start() -> None:
    readme = REPO_ROOT / "README.md"
    assert _lines(readme) < README_MAX_LINES
    sections = re.findall(r"^## (.+)$", readme.read_text(), re.M)
    assert sections[:2] == ["Install", "Quick start"]
