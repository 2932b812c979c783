"""The design notes and their citations agree: every `NOTE [name]` the code
cites (tiering/, shim/, tests/, bench/, setup.py, Makefile) is defined in
docs/design.md, as a heading `### NOTE [name]` or a paragraph that starts
`NOTE [name]`, once; every note defined there is cited from outside it; and
the notes that README.md and docs/*.md name are defined too."""
from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO

DESIGN = REPO / "docs" / "design.md"
CODE = ("tiering", "shim", "tests", "bench")
CODE_FILES = ("setup.py", "Makefile")
GENERATED = (REPO / "bench" / "results",)   # the benchmarks' outputs, not code
BINARY = {".so", ".o", ".pyc", ".png", ".npy", ".gz", ".tar", ".jpg", ".jpeg", ".pdf"}

DEFINITION = re.compile(r"(?:### )?NOTE \[([^\]]+)\]")
# a citation, also wrapped across the lines of a comment or a string:
# "(NOTE [names\n# first])", "/* (NOTE [alias */\n/* invalidation]) */"
CITATION = re.compile(r"(?<!`)NOTE\s+\[([^\]\[]{1,120})\]")
LINE_BREAK = re.compile(r"""["']?\s*(?:\*/)?\s*\n\s*(?:#+|//|/\*|\*|;|-)?\s*["']?""")


def cited_in(text: str) -> list[str]:
    return [" ".join(LINE_BREAK.sub(" ", m.group(1)).split()) for m in CITATION.finditer(text)]


def defined() -> dict[str, int]:
    """Each note's name and how many times docs/design.md defines it."""
    names: dict[str, int] = {}
    for line in DESIGN.read_text().splitlines():
        if m := DEFINITION.match(line):
            names[m.group(1)] = names.get(m.group(1), 0) + 1
    return names


def code_files() -> list[Path]:
    files = [REPO / name for name in CODE_FILES]
    for top in CODE:
        for p in sorted((REPO / top).rglob("*")):
            if (p.is_file() and "__pycache__" not in p.parts and p.suffix not in BINARY
                    and not any(p.is_relative_to(g) for g in GENERATED)
                    and p != Path(__file__).resolve()):   # this file's examples are not citations
                files.append(p)
    return files


def citations() -> dict[str, set[str]]:
    """Each note the code cites, and the files citing it."""
    out: dict[str, set[str]] = {}
    for p in code_files():
        try:
            text = p.read_text()
        except UnicodeDecodeError:    # a binary without a known suffix (a built test program)
            continue
        for name in cited_in(text):
            out.setdefault(name, set()).add(str(p.relative_to(REPO)))
    return out


def test_a_wrapped_citation_is_read_whole() -> None:
    assert cited_in("x (NOTE [names\n    # first]) y") == ["names first"]
    assert cited_in("/* (NOTE [alias            */\n   /* invalidation], docs/design.md) */") == ["alias invalidation"]
    assert cited_in('"see NOTE [one read "\n    "per file]"') == ["one read per file"]
    assert cited_in("as `NOTE [name]`") == []


def test_every_note_is_defined_once() -> None:
    names = defined()
    assert len(names) > 40
    assert {n: k for n, k in names.items() if k > 1} == {}


def test_every_note_cited_in_the_code_is_defined() -> None:
    names, cites = defined(), citations()
    undefined = {n: sorted(files) for n, files in cites.items() if n not in names}
    assert undefined == {}, f"cited but not defined in docs/design.md: {undefined}"


def test_every_defined_note_is_cited_outside_the_design_notes() -> None:
    cites = citations()
    never = sorted(n for n in defined() if n not in cites)
    assert never == [], f"defined in docs/design.md, cited nowhere in the code: {never}"


def test_the_notes_the_documents_name_are_defined() -> None:
    names = defined()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        undefined = sorted(set(cited_in(doc.read_text())) - set(names))
        assert undefined == [], f"{doc.relative_to(REPO)} names notes docs/design.md does not define: {undefined}"
