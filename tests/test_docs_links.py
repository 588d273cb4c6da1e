"""Every relative link and image in the README and docs/ points at a file or folder of the
repository (a path relative to the repository root inside docs/ is the usual slip)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    targets = [m.group(1) for m in LINK.finditer(page.read_text())]
    local = [t for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    missing = [t for t in local if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_the_checker_finds_links():
    """The pattern sees both kinds (a checker that matched nothing would pass every page)."""
    found = [m.group(1) for m in LINK.finditer('a [doc](docs/x.md) and ![plot](y.png "t")')]
    assert found == ["docs/x.md", "y.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_cites_an_issue_number(page):
    """"issue 17" means something to the project's tracker, nothing to a reader."""
    assert not re.findall(r"\b[Ii]ssues? \d+", page.read_text())
