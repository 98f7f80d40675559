"""Every module of rayk and every public class in it opens with a docstring.

A newcomer finds a concept by its module and learns from its class what it owns, who
drives it and how long it lives, without reading the code first (the layout issue: "A
docstring on every public class, that says what it owns, as the module docstrings
already do"). What a docstring says is for review; that there is one is checked here,
by reading the source (ast), so nothing is imported. There is no exception list: a
class that nobody outside its module should need is private (`_Name`) instead.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "rayk"  # read, not imported


def modules() -> Iterator[tuple[str, ast.Module]]:
    """(path relative to the repository, parsed source) of every module, `__init__.py` included."""
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        yield str(path.relative_to(PACKAGE_DIR.parent)), ast.parse(path.read_text(), filename=str(path))


def has_docstring(node: ast.Module | ast.ClassDef) -> bool:
    return bool((ast.get_docstring(node) or "").strip())


def test_the_walk_reads_every_module_of_the_package():
    # Guards the two tests below against passing on nothing (a moved package, an empty glob).
    found = {path for path, _ in modules()}
    assert "rayk/__init__.py" in found and "rayk/errors.py" in found and "rayk/storage/log.py" in found
    assert len(found) > 100, f"only {len(found)} modules found under {PACKAGE_DIR}"


def test_every_module_has_a_docstring():
    missing = [path for path, tree in modules() if not has_docstring(tree)]
    assert not missing, "modules without a docstring (say what the module owns):\n" + "\n".join(missing)


def test_every_public_class_has_a_docstring():
    # Nested classes and classes defined in functions count too, as /work/tools/docstrings.py counts them.
    missing = [
        f"{path}:{node.lineno}: {node.name}"
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not has_docstring(node)
    ]
    assert not missing, (
        "public classes without a docstring (say what one instance is or owns, who makes it, "
        "its lifecycle and thread-safety; or make the class private):\n" + "\n".join(missing)
    )
