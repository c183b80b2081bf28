"""Every document the code cites is in the repository.

A docstring, a comment or a guide that cites a document names a file of this
repository (`docs/decisions/operation-class-policy.md`, `docs/transport.md`, ...),
and that file exists. A decision is cited by its record in `docs/decisions/` and its
number ("Decision 8"), which must be a section of that record. A name for a
document that is not here (an "ADR", "API.md", "the seed") is refused unless the
same text also gives the repository path it means.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("queue_server", "client", "tests", "reliability", "bench")
GUIDES = ("README.md", "docs", "queue_server", "client", "tests", "reliability", "bench")
THIS = Path(__file__).resolve()

# A repository path of a document: `docs/transport.md`, `tests/policy_proof/README.md`.
DOC_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|tests|queue_server|client|reliability|bench|deploy)/[\w./-]*\w\.md)\b"
)
# A markdown link to a document beside the guide: `[x](decisions/operation-class-policy.md)`.
MD_LINK = re.compile(r"\]\(([^)#\s:]+\.md)(?:#[^)]*)?\)")
# Names of documents that are not in the repository.
ELSEWHERE = re.compile(r"\bADRs?\b|\bADR-\d+|(?<![\w/])API\.md\b|\b[Tt]he seed\b|\bseed's\b")
DECISION = re.compile(r"\bDecisions? (\d+(?:\s*(?:-|,|and)\s*\d+)*)")
HEADING = re.compile(r"^#+ Decision (\d+)\b", re.MULTILINE)
# What every citation above holds somewhere: a module without any of these cites nothing,
# and its docstrings and comments need not be taken apart (four modules in five).
MAY_CITE = re.compile(r"decision|\.md|adr|seed", re.IGNORECASE)


@dataclass(frozen=True)
class Text:
    """One docstring, comment block or guide, with where it is."""

    file: Path
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def python_texts(path: Path, source: str) -> Iterator[Text]:
    """The docstrings and the comments of a module (a run of comment lines is one text)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                yield Text(path, node.body[0].lineno, doc)
    block: list[str] = []
    start = last = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        if block and line != last + 1:
            yield Text(path, start, "\n".join(block))
            block = []
        if not block:
            start = line
        block.append(token.string.lstrip("#").strip())
        last = line
    if block:
        yield Text(path, start, "\n".join(block))


def _python_files() -> list[Path]:
    files = [p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py"))]
    return [p for p in files if p.resolve() != THIS and "migrations/versions" not in str(p)]


def _guides() -> list[Path]:
    files = []
    for name in GUIDES:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.md"))
    return [p for p in files if "/results/" not in p.as_posix()]


def _numbers(spec: str) -> set[int]:
    numbers: set[int] = set()
    for low, high in re.findall(r"(\d+)(?:\s*-\s*(\d+))?", spec):
        numbers.update(range(int(low), int(high or low) + 1))
    return numbers


def _cited(text: Text) -> list[Path]:
    found = [ROOT / m for m in DOC_PATH.findall(text.text)]
    if text.file.suffix == ".md":
        found += [text.file.parent / m for m in MD_LINK.findall(text.text)]
    return [p.resolve() for p in found]


def problems(texts: list[Text]) -> list[str]:
    """What is wrong with the citations of one file's texts."""
    found: list[str] = []
    records = ROOT / "docs" / "decisions"
    # A decision record cites its own decisions.
    decisions = {t.file.resolve() for t in texts if t.file.resolve().parent == records}
    for text in texts:
        cited = _cited(text)
        for path in cited:
            if not path.is_file():
                found.append(f"{text.where}: cites {path.relative_to(ROOT)}, which does not exist")
        decisions |= {p for p in cited if p.parent == records and p.is_file()}
        named = ELSEWHERE.search(text.text)
        if named and not any(p.is_file() for p in cited):
            found.append(
                f"{text.where}: cites {named.group(0)!r}, which is not in the repository:"
                " name the file (docs/decisions/..., docs/...)"
            )
    sections = {n for p in decisions for n in map(int, HEADING.findall(p.read_text()))}
    for text in texts:
        for spec in DECISION.findall(text.text):
            if not decisions:
                found.append(
                    f"{text.where}: cites Decision {spec} but no record of docs/decisions/"
                )
            elif missing := _numbers(spec) - sections:
                found.append(f"{text.where}: Decision {sorted(missing)} is in no cited record")
    return found


def _texts(path: Path) -> list[Text]:
    source = path.read_text()
    if path.suffix == ".md":
        return [Text(path, 1, source)]
    if not MAY_CITE.search(source):
        return []
    return list(python_texts(path, source))


def test_every_document_a_docstring_or_comment_cites_is_in_the_repository() -> None:
    found = [hit for path in _python_files() for hit in problems(_texts(path))]
    assert found == []


def test_every_document_a_guide_cites_is_in_the_repository() -> None:
    found = [hit for path in _guides() for hit in problems(_texts(path))]
    assert found == []


def test_each_decision_record_numbers_its_decisions() -> None:
    records = sorted((ROOT / "docs" / "decisions").glob("*.md"))
    assert {p.name for p in records} >= {
        "operation-class-policy.md",
        "transport-accounting.md",
    }
    policy = (ROOT / "docs/decisions/operation-class-policy.md").read_text()
    assert sorted(map(int, HEADING.findall(policy))) == list(range(1, 9))
    transport = (ROOT / "docs/decisions/transport-accounting.md").read_text()
    assert sorted(map(int, HEADING.findall(transport))) == list(range(1, 10))


@pytest.mark.parametrize(
    "source",
    [
        '"""Rows as the JSON the API returns (API.md)."""',
        '"""The cancellation rule (ADR Decision 6)."""',
        "# the seed's negative control\nX = 1\n",
        '"""See docs/decisions/no-such-record.md."""',
        '"""Decision 8 of the policy."""',
        '"""Decision 12 of docs/decisions/operation-class-policy.md."""',
    ],
)
def test_a_planted_citation_of_a_missing_document_is_found(source: str) -> None:
    path = ROOT / "queue_server" / "planted.py"
    assert problems(list(python_texts(path, source))) != []


@pytest.mark.parametrize(
    "text",
    [
        "The policy (ADR-0088) is data.",
        "See [the API](API.md).",
        "See [the record](decisions/no-such-record.md).",
        "The seed's negative control.",
    ],
)
def test_a_planted_citation_in_a_guide_is_found(text: str) -> None:
    assert problems([Text(ROOT / "docs" / "planted.md", 1, text)]) != []


def test_a_citation_with_its_repository_path_passes() -> None:
    source = (
        '"""Decisions 5-7 of docs/decisions/operation-class-policy.md."""\n'
        "# Decision 4: these classes use the canonical circuit breaker.\n"
        "X = 1  # docs/transport.md, rule 9\n"
    )
    path = ROOT / "queue_server" / "planted.py"
    assert problems(list(python_texts(path, source))) == []
