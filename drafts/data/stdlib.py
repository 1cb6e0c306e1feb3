"""Python standard-library sources: a code corpus present on every machine that runs Python.

Files come from sysconfig's stdlib path (installed packages under site-packages are not part
of it: they differ from machine to machine). The train / held-out split is by file and by a
hash of the file's path relative to the stdlib root, so it is the same on every machine and
no held-out file ever leaks into training through a shared prefix.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass

# Folders that are not the library's own code, or whose files are deliberately broken or huge
# data tables (test suites, lib2to3 fixtures, encodings tables).
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test",
                           "encodings", "lib2to3"})
MAX_FILE_BYTES = 200_000


@dataclass(frozen=True)
class SourceFile:
    relative_path: str  # relative to the stdlib root, "/"-separated
    path: str


def stdlib_root() -> str:
    root = sysconfig.get_paths()["stdlib"]
    if not os.path.isdir(root):
        raise FileNotFoundError(f"the Python standard library folder {root!r} (sysconfig stdlib) does not exist")
    return root


def is_held_out(relative_path: str, held_out_percent: float) -> bool:
    """Whether a file belongs to the held-out split: a stable hash of its relative path."""
    digest = hashlib.sha256(relative_path.encode("utf-8")).digest()
    bucket = int.from_bytes(digest[:8], "big") % 10_000
    return bucket < held_out_percent * 100


def list_stdlib_files(root: str | None = None) -> list[SourceFile]:
    """Every .py file under the stdlib root except the skipped folders, sorted by path."""
    root = root or stdlib_root()
    files: list[SourceFile] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if 0 < size <= MAX_FILE_BYTES:
                files.append(SourceFile(os.path.relpath(path, root).replace(os.sep, "/"), path))
    files.sort(key=lambda f: f.relative_path)
    return files


def split_files(files: list[SourceFile], held_out_percent: float) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, held_out) by is_held_out."""
    if not 0 <= held_out_percent < 100:
        raise ValueError(f"held_out_percent must be in [0, 100), got {held_out_percent}")
    train = [f for f in files if not is_held_out(f.relative_path, held_out_percent)]
    held_out = [f for f in files if is_held_out(f.relative_path, held_out_percent)]
    return train, held_out


def read_source(file: SourceFile) -> str | None:
    """The file's text, or None when it is not UTF-8 (a handful of legacy-encoded files)."""
    try:
        with open(file.path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def iter_sources(files: list[SourceFile], seed: int) -> Iterator[tuple[SourceFile, str]]:
    """Files in a seeded order (so a token budget takes a spread of modules, not the first
    alphabetically) with their text."""
    order = list(files)
    random.Random(seed).shuffle(order)
    for file in order:
        text = read_source(file)
        if text and text.strip():
            yield file, text


def code_prompt(text: str, *, num_lines: int, rng: random.Random) -> str | None:
    """A completion prompt cut from a source file: num_lines lines starting at a `def` or
    `class` line chosen at random (None when the file has none)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "class ", "async def "))]
    if not starts:
        return None
    start = rng.choice(starts)
    # Include a few lines of context above the definition (decorators, comments, imports).
    start = max(0, start - 3)
    return "".join(lines[start: start + num_lines])
