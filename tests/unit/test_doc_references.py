"""Every `§` reference in the code and the docs lands on a section of a document in
this repository, and nothing points at documents outside it.

The convention is docs/protocol/README.md's: the word before `§` names the document
(`xDS`, `Linkerd`, `RFC 9113`, `RFC 7541`, `RFC 9110`); a bare `§` means the package's
document inside xds_api/, linkerd_api/ and h2grpc/, the document itself inside
docs/protocol/, and elsewhere the document of the nearest tagged reference before it
in the same file. In Markdown a reference may also be a link to the section.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "docs" / "protocol"

CODE_DIRS = ("bridge", "meshbridge", "h2grpc", "linkerd_api", "xds_api", "harness", "tests",
             "bench", "fuzz", "scripts")
CODE_SUFFIXES = (".py", ".proto")

# tag -> (document, anchor prefix)
TAGS: dict[str, tuple[str, str]] = {
    "xDS": ("xds.md", "s"),
    "Linkerd": ("linkerd-destination.md", "s"),
    "Routes": ("routes.md", "s"),
    "RFC 9113": ("http2.md", "rfc9113-"),
    "RFC 7541": ("http2.md", "rfc7541-"),
    "RFC 9110": ("http2.md", "rfc9110-"),
}
# A bare `§` in these folders means this tag.
FOLDER_DEFAULTS = {"xds_api": "xDS", "linkerd_api": "Linkerd", "h2grpc": "RFC 9113"}
# A bare `§` inside a protocol document means that document.
SELF_TAG = {"xds.md": "xDS", "linkerd-destination.md": "Linkerd", "http2.md": "RFC 9113",
            "routes.md": "Routes"}

NUMBER = r"\d+(?:\.\d+)*"
REFERENCE = re.compile(rf"§\s*({NUMBER})(?:\s*[-\u2013]\s*({NUMBER}))?")
TAG_BEFORE = re.compile(r"(" + "|".join(re.escape(t) for t in TAGS) + r")\s*$")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
INLINE_CODE = re.compile(r"`[^`\n]*`")
# Pointers to documents that are not in the repository.
OUTSIDE = re.compile(r"specs/|\.\./shared|DESIGN\.md|STYLE\.md|\bSTYLE:|\bDESIGN:"
                     r"|\bspecs?\s+§|\bspecs?,?\s+section\s+\d")


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}: {self.text.strip()}"


@cache
def anchors(doc: Path) -> frozenset[str]:
    return frozenset(ANCHOR.findall(doc.read_text(encoding="utf-8")))


def files() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for d in CODE_DIRS:
        found += sorted(p for p in (REPO / d).rglob("*") if p.suffix in CODE_SUFFIXES)
    return [p for p in found if p.is_file() and p != Path(__file__).resolve()]


def default_tag(path: Path) -> str | None:
    rel = path.relative_to(REPO)
    if rel.parts[0] in FOLDER_DEFAULTS:
        return FOLDER_DEFAULTS[rel.parts[0]]
    if path.parent == PROTOCOL:
        return SELF_TAG.get(path.name)
    return None


def check_number(tag: str, number: str) -> str | None:
    doc, prefix = TAGS[tag]
    if f"{prefix}{number}" not in anchors(PROTOCOL / doc):
        return f"no section {number} in docs/protocol/{doc}"
    return None


def problems_in(path: Path) -> list[Problem]:
    rel = str(path.relative_to(REPO))
    markdown = path.suffix == ".md"
    fixed = default_tag(path)
    last_tag: str | None = None
    out: list[Problem] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        # In Markdown, `code spans` are examples, not references.
        scan = INLINE_CODE.sub(lambda m: " " * len(m.group()), line) if markdown else line
        if OUTSIDE.search(scan):
            out.append(Problem(rel, n, line, "points at a document outside the repository"))
        if markdown and line.startswith("#"):
            continue  # a heading defines a section; it does not cite one
        links = [(m.span(1), m.group(2), m.group(3)) for m in LINK.finditer(scan)]
        for ref in REFERENCE.finditer(scan):
            numbers = [x for x in ref.groups() if x]
            link = next((lk for lk in links if lk[0][0] <= ref.start() < lk[0][1]), None)
            if markdown and link is not None:
                _, target, anchor = link
                doc = (path.parent / target).resolve() if target else path
                if not doc.is_file():
                    out.append(Problem(rel, n, line, f"links to a missing file {target}"))
                elif not anchor or anchor not in anchors(doc):
                    out.append(Problem(rel, n, line, f"no anchor #{anchor} in {target}"))
                continue
            tagged = TAG_BEFORE.search(scan[:ref.start()])
            if tagged:
                tag: str | None = tagged.group(1)
                last_tag = tag
            else:
                tag = fixed or last_tag
            if tag is None:
                out.append(Problem(rel, n, line, "a § that names no document"))
                continue
            for number in numbers:
                why = check_number(tag, number)
                if why:
                    out.append(Problem(rel, n, line, why))
    return out


def test_protocol_documents_have_anchored_sections() -> None:
    for doc in {d for d, _ in TAGS.values()}:
        assert anchors(PROTOCOL / doc), f"docs/protocol/{doc} has no section anchors"


def test_every_section_reference_resolves_inside_the_repository() -> None:
    problems = [p for path in files() for p in problems_in(path)]
    assert not problems, (f"{len(problems)} references do not resolve "
                          "(see docs/protocol/README.md):\n" + "\n".join(map(str, problems)))
