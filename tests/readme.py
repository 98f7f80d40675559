"""The fenced blocks of README.md and of the documentation site's pages (docs/, in the order
of mkdocs.yml's navigation), for the tests that run them as written: tests/test_readme.py
runs the Python examples that need only a cluster, and the modules whose setting a block
needs run the others (a Spark session, certificates, the `rayk` command, Ray's metrics
port). Each block is found by its first line, on whichever page it is."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
NAV_PAGE = re.compile(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w/.-]+\.md)\s*$", re.MULTILINE)


def pages() -> list[Path]:
    """README.md, then every page of the site in the order of mkdocs.yml's navigation (the
    order a reader meets them in)."""
    return [README] + [DOCS / page for page in NAV_PAGE.findall((ROOT / "mkdocs.yml").read_text())]


def page_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of one page, in order."""
    return FENCE.findall(page.read_text())


def readme_blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the README and the pages, in order."""
    return [found for page in pages() for found in page_blocks(page)]


def first_line(code: str) -> str:
    return code.splitlines()[0].rstrip() if code.strip() else ""


def block(start: str) -> str:
    """The code of the one block that starts with `start`."""
    found = [code for _language, code in readme_blocks() if code.startswith(start)]
    assert len(found) == 1, f"{len(found)} blocks of the README and the pages start with {start!r}"
    return found[0]


def run(start: str, namespace: dict, replacements: dict[str, str] | None = None) -> None:
    """Runs the Python block that starts with `start` in `namespace`, with each key of
    `replacements` (what points outside the test: a path, a port) replaced by its value."""
    code = block(start)
    for written, here in (replacements or {}).items():
        assert written in code, f"{written!r} is not in the block"
        code = code.replace(written, here)
    exec(compile(code, f"README: {first_line(code)}", "exec"), namespace)


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a bash block as argument lists: comments dropped, `;` separating
    commands, a pipe kept as the token "|"."""
    commands: list[list[str]] = []
    for line in code.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        command: list[str] = []
        for token in lexer:
            if token == ";":
                commands.append(command)
                command = []
            else:
                command.append(token)
        if command:
            commands.append(command)
    return [c for c in commands if c]
