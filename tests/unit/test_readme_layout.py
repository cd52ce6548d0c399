"""The README's layout block is the tree as it is: every file and folder it names
exists, every module of every package is named in it, and so is every top-level
folder.

The block's grammar: a line whose indentation is less than the description column
(where the first line's description starts) names entries: one folder (`name/`) or
files (`a.py, b.py`), then at least two spaces and what they are. Entries indented
under a folder are inside it; a line indented to the description column continues a
description."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^[\w.-]+(/|\.\w+)$")
# Every installed package, and the test kit beside them.
PACKAGES = [p.rstrip("*") for p in tomllib.loads((REPO / "pyproject.toml").read_text())
            ["tool"]["setuptools"]["packages"]["find"]["include"]] + ["testkit"]


def layout_block() -> list[str]:
    blocks: list[list[str]] = []
    inside = False
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside:
            blocks[-1].append(line)
    layouts = [b for b in blocks if b and b[0].startswith("bridge/")]
    assert len(layouts) == 1, "the README has one layout block, starting with bridge/"
    return layouts[0]


def named_paths() -> list[str]:
    """Every path the block names, relative to the repository (folders end in /)."""
    lines = layout_block()
    first = re.match(r"\S+ {2,}", lines[0])
    assert first is not None, f"no description on the first line: {lines[0]!r}"
    column = first.end()
    folders: list[tuple[int, str]] = []  # (indentation, path) of the enclosing folders
    paths = []
    for number, line in enumerate(lines, 1):
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent >= column:
            continue  # a description going on
        names = line.strip().split("  ", 1)[0].split(", ")
        assert all(NAME.match(n) for n in names), \
            f"README layout line {number}: {line.strip()[:40]!r} names no file or folder"
        while folders and folders[-1][0] >= indent:
            folders.pop()
        parent = folders[-1][1] if folders else ""
        for name in names:
            paths.append(parent + name)
            if name.endswith("/"):
                assert len(names) == 1, f"README layout line {number}: a folder alone"
                folders.append((indent, parent + name))
    return paths


def test_every_path_the_layout_names_exists() -> None:
    missing = [p for p in named_paths() if not (REPO / p).exists()
               or (REPO / p).is_dir() != p.endswith("/")]
    assert not missing, f"the README's layout names what is not there: {missing}"


def test_every_module_of_every_package_is_named_in_the_layout() -> None:
    named = set(named_paths())
    modules = [str(f.relative_to(REPO)) for package in PACKAGES
               for f in sorted((REPO / package).rglob("*.py"))
               if f.name != "__init__.py" and "_pb2" not in f.name]
    unnamed = [m for m in modules if m not in named]
    assert not unnamed, f"modules the README's layout does not name: {unnamed}"


def test_every_top_level_folder_is_named_in_the_layout() -> None:
    named = set(named_paths())
    # What .gitignore leaves out (a venv, outputs) is not the tree.
    ignored = [line.strip().strip("/") for line in (REPO / ".gitignore").read_text().split()
               if line.strip().endswith("/")]
    folders = [f"{d.name}/" for d in sorted(REPO.iterdir()) if d.is_dir()
               and not d.name.startswith(".")
               and not any(fnmatch.fnmatch(d.name, pattern) for pattern in ignored)]
    unnamed = [f for f in folders if f not in named]
    assert not unnamed, f"top-level folders the README's layout does not name: {unnamed}"
