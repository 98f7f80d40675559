"""Imports only point down: every module of rayk, its function-level imports too, imports
only modules of its own layer or of the layers below (the order in docs/design-notes/layout.md).

Kafka keeps its modules apart the same way (clients and common at the bottom, storage,
metadata, the coordinators, server on top); a cycle between layers is what makes a
code base impossible to change one part at a time. There is no exception list: a module in
the wrong layer moves, or what it needs moves down.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rayk

PACKAGE_DIR = Path(rayk.__file__).parent

# Bottom to top. A module belongs to the first entry that is it or a package holding it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("common", ("rayk.errors", "rayk.listeners", "rayk.acls", "rayk.quotas", "rayk.scram", "rayk.metrics",
                "rayk.internal_topics", "rayk.consumer_protocol", "rayk.ray_console", "rayk.child_stderr",
                "rayk.native_paths", "rayk.ray_settings", "rayk._native")),  # _native: compiled (native/), imports nothing of rayk
    ("storage", ("rayk.storage",)),
    ("config", ("rayk.config",)),
    ("metadata", ("rayk.metadata",)),
    ("dataplane", ("rayk.dataplane",)),
    ("actors", ("rayk.actors",)),  # what every rayk actor shares: options, supervision, direct calls
    ("replication", ("rayk.replication",)),
    ("coordinator", ("rayk.coordinator",)),
    ("server", ("rayk.server",)),
    ("controller", ("rayk.controller",)),
    ("net", ("rayk.net",)),
    ("broker", ("rayk.broker",)),
    ("client", ("rayk.client",)),
    ("entry points", ("rayk.data", "rayk.spark", "rayk.spark_daemon", "rayk.work_queue", "rayk.perf", "rayk.cli",
                      "rayk.demo", "rayk")),
]


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "rayk"):
            return rank
    if module == "rayk":
        return len(LAYERS) - 1
    raise AssertionError(f"{module} is in no layer: give it one in LAYERS (and in docs/design-notes/layout.md)")


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imported(path: Path, known: set[str]) -> set[str]:
    """The rayk modules `path` imports anywhere in it (a `from package import name` of a
    submodule counts as that submodule)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "rayk"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "rayk":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                out.add(submodule if submodule in known else node.module)
    return out


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_imports_only_point_down():
    found = modules()
    upward = []
    for name, path in sorted(found.items()):
        rank = layer_of(name)
        for target in sorted(imported(path, set(found))):
            if layer_of(target) > rank:
                upward.append(f"{name} ({LAYERS[rank][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_the_check_sees_function_level_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from rayk.client import producer\n    import rayk.net.codec\n")
    assert imported(module, {"rayk.client.producer"}) == {"rayk.client.producer", "rayk.net.codec"}
