"""Every relative link in README.md, CHANGELOG.md and docs/ reaches its file and its section.

Moving dated runs to docs/journal/ (issue #47) renamed sections other pages linked to; one link,
communication.md's ``performance.md#collectives``, had pointed at no section since it was written.
Anchors are GitHub's: a heading lower-cased, punctuation but ``-`` and ``_`` dropped, spaces made
``-``, a repeat suffixed ``-1``; and every ``<a id="...">``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"```.*?```", re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    found = set(re.findall(r'<a id="([^"]+)"', text))
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        if match := re.match(r"#+ (.*)", line):
            name = slug(match.group(1))
            found.add(f"{name}-{seen[name]}" if name in seen else name)
            seen[name] = seen.get(name, 0) + 1
    return found


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_relative_link_reaches_its_file_and_section() -> None:
    broken = []
    for page in pages():
        for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such section)")
    assert broken == []


def test_the_glossarys_causes_are_the_diagnosis_causes_in_order() -> None:
    """The glossary lists the causes by hand; it left out desync when that cause came (issue #57)."""
    from gputop.diagnose.findings import CAUSES

    listed = re.search(r"\(`CAUSES`: ([^)]*)\)", (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8"))
    assert listed and tuple(listed[1].split(", ")) == CAUSES, listed
