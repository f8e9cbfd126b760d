"""References between the repository's documents resolve, and the package cites no
internal material.

Section references. A ``§N`` (``§6``, ``§8.2``; lists ``§3, §11``, ranges ``§6–§7`` or
``§6–7``) belongs to the Markdown file named right before it: ``docs/method.md §6``,
``method.md §6``, ``[method.md](method.md) §6``. A ``§N`` with no file name before it
means a section of the page it stands in, and is allowed only in ``docs/*.md``. Either
way the document must have a heading numbered ``N`` (``## 6. …`` or ``### 6.1 …``).

Internal references. Nothing in ``ctuq/`` cites ``scripts/``, ``tests/`` or a test file,
or an issue number (``issue 21``, ``#21``); the user documents (README, CHANGELOG,
``docs/*.md``) cite no issue number either. They cite the ``docs/`` page that explains
instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "build", "dist", "node_modules", "__pycache__", ".pytest_cache",
             ".hypothesis", "demo_out", "shared"}
TEXT = {".md", ".py", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".sh", ""}

_NUM = r"\d+(?:\.\d+)*"
# a file name, optionally as a Markdown link "[x.md](x.md)", then a chain of § numbers
_CITED = re.compile(rf"(?P<doc>[\w./-]+\.md)(?:\]\([\w./-]+\.md\))?\)?[ \t]*"
                    rf"(?P<refs>§{_NUM}(?:[ \t]*(?:,|–|-|and)[ \t]*§?{_NUM})*)")
_ANY = re.compile(rf"§(?P<n>{_NUM})(?:[ \t]*[–-][ \t]*§?(?P<m>{_NUM}))?")
_HEADING = re.compile(rf"^#+[ \t]+(?P<n>{_NUM})\.?[ \t]", re.M)


def _files():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in filenames:
            path = Path(dirpath) / name
            if path.suffix in TEXT and path != Path(__file__).resolve():
                yield path


def _headings(doc: Path) -> set[str]:
    return set(_HEADING.findall(doc.read_text(encoding="utf-8")))


def _resolve(name: str, source: Path) -> Path | None:
    """The document a cited name means: relative to the citing file, else to docs/ or the root."""
    for base in (source.parent, ROOT / "docs", ROOT):
        candidate = (base / name).resolve()
        if candidate.is_file():
            return candidate
    return None


def _numbers(chain: str) -> list[str]:
    return re.findall(_NUM, chain)


def section_references(path: Path, text: str):
    """``(line, document or None, number)`` for every § reference of one file."""
    out, taken = [], []
    for m in _CITED.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        for n in _numbers(m.group("refs")):
            out.append((line, m.group("doc"), n))
        taken.append(m.span("refs"))
    for m in _ANY.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue
        line = text.count("\n", 0, m.start()) + 1
        for n in (m.group("n"), m.group("m")):
            if n:
                out.append((line, None, n))
    return out


def test_every_section_reference_resolves():
    problems, count = [], 0
    for path in _files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if "§" not in text:
            continue
        rel = path.relative_to(ROOT)
        for line, doc, n in section_references(path, text):
            count += 1
            if doc is None:
                if rel.parts[0] != "docs" or rel.suffix != ".md":
                    problems.append(f"{rel}:{line}: §{n} names no document")
                    continue
                target = path
            else:
                target = _resolve(doc, path)
                if target is None:
                    problems.append(f"{rel}:{line}: {doc} §{n}: no such file")
                    continue
            if n not in _headings(target):
                problems.append(f"{rel}:{line}: §{n} is not a numbered heading of "
                                f"{target.relative_to(ROOT)}")
    assert count > 50, "the scan found too few references: is the pattern broken?"
    assert not problems, "\n".join(problems)


ISSUE = re.compile(r"(?i)\b(?:issues?|pull request|PR)[ \t]*#?\d+|(?<![\w&/\"'])#\d{1,4}\b(?![\w-])")
INTERNAL = re.compile(r"(?<![\w.-])(?:scripts|tests)/|\btest_\w+\.py\b")


def _hits(pattern, paths):
    hits = []
    for path in paths:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    return hits


def test_package_cites_no_scripts_tests_or_issues():
    files = sorted((ROOT / "ctuq").rglob("*.py")) + sorted((ROOT / "ctuq").rglob("*.yaml"))
    assert files
    hits = _hits(INTERNAL, files) + _hits(ISSUE, files)
    assert not hits, "cite the docs/ page instead:\n" + "\n".join(hits)


def test_user_documents_cite_no_issue_numbers():
    docs = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    hits = _hits(ISSUE, [p for p in docs if p.is_file()])
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("text, expected", [
    ("see docs/method.md §6.3 and §7", [("docs/method.md", "6.3"), ("docs/method.md", "7")]),
    ("([method.md](method.md) §3, §8.3, §11)", [("method.md", "3"), ("method.md", "8.3"),
                                                  ("method.md", "11")]),
    ("(docs/method.md §6–7)", [("docs/method.md", "6"), ("docs/method.md", "7")]),
    ("[scaling.md](scaling.md) §1, §4", [("scaling.md", "1"), ("scaling.md", "4")]),
    ("as §5 says", [(None, "5")]),
])
def test_reference_parsing(text, expected):
    # the rule of the module docstring, on the forms the documents use
    assert [(d, n) for _, d, n in section_references(ROOT / "README.md", text)] == expected


def test_patterns_catch_what_they_should():
    assert ISSUE.search("as issue 21 asked") and ISSUE.search("(#12)")
    assert not ISSUE.search('_COLORS = {"map": "#444444"}') and not ISSUE.search("#1f77b4")
    assert INTERNAL.search("measured in tests/test_x.py") and INTERNAL.search("scripts/bench.py")
    assert not INTERNAL.search("docs/scaling.md") and not INTERNAL.search("n_tests/2")


_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def test_relative_links_of_the_documents_resolve():
    # Markdown links and images between the repository's own files (web links aside)
    docs = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for path in docs:
        if not path.is_file():
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _LINK.finditer(line):
                target = m.group("target").split("#")[0]
                if not target or re.match(r"[a-z]+:", target):
                    continue
                if not (path.parent / target).exists():
                    broken.append(f"{path.relative_to(ROOT)}:{i}: {m.group('target')}")
    assert not broken, "\n".join(broken)
