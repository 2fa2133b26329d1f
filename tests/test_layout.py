"""The package's shape: the layers drawn in ``celery_lease/__init__.py``, no import circle, no
module over its budget (800 lines), and no Redis command built outside ``celery_lease/store/``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import celery_lease

PACKAGE = Path(celery_lease.__file__).parent

#: Subpackage (or root module) -> layer, bottom (0) to top: a module may import from its own
#: layer and those below. The root's re-exports of documented paths sit above everything.
LAYERS = {
    "errors": 0,
    "base": 0,
    "store": 1,
    "settings": 2,
    "core": 3,
    "policies": 4,
    "execution": 5,
    "holds": 5,
    "beat": 6,
    "ops": 7,
    **dict.fromkeys(["signals", "flower", "metrics", "testing"], 8),
}

#: A soft budget: a module past it is a concept to split, not lines to fold.
MAX_LINES = 800
#: redis-py client methods that send a command, those no other object here has a method of
#: the same name for (not get, set, delete, info, time: dicts, events, loggers have them).
COMMANDS = {
    "pipeline",
    "execute_command",
    "hset",
    "hget",
    "hgetall",
    "hdel",
    "pttl",
    "pexpire",
    "expire",
    "blpop",
    "rpush",
    "lpush",
    "eval",
    "evalsha",
    "script_load",
    "scan",
    "scan_iter",
    "ping",
    "config_get",
    "publish",
    "register_script",
    "setex",
    "mget",
    "unlink",
    "flushall",
    "flushdb",
    "send_packed_command",
    "read_response",
}
#: The one exception: the pytest plugin empties its own embedded test server between tests.
ALLOWED = {("ops.testing", "flushall")}


def modules() -> dict[str, Path]:
    """Dotted name below the package (``"store.wire"``; ``"store"`` for its ``__init__``) ->
    file; the package's own ``__init__`` is left out (it imports the public names)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules ``name`` imports when it runs (in functions too; not the imports
    under ``if TYPE_CHECKING:``, which never run)."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    known = modules()
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
            elif node.module and node.module.startswith("celery_lease"):
                base, node = (
                    [],
                    ast.ImportFrom(
                        module=node.module.removeprefix("celery_lease").lstrip("."),
                        names=node.names,
                        level=0,
                    ),
                )
            else:
                base = None
            if base is not None:
                stem = [*base, *(node.module.split(".") if node.module else [])]
                for alias in node.names:
                    candidate = ".".join([*stem, alias.name])
                    found.add(candidate if candidate in known else ".".join(stem))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    return {name: _imports(name, path) for name, path in modules().items()}


def layer(name: str) -> int:
    return LAYERS[name.split(".")[0]]


def test_every_module_has_a_layer() -> None:
    assert sorted(n for n in modules() if n.split(".")[0] not in LAYERS) == []


def test_no_module_imports_a_module_of_a_layer_above_its_own() -> None:
    upward = [
        f"{name} imports {other}"
        for name, deps in graph().items()
        for other in deps
        if layer(other) > layer(name)
    ]
    assert upward == []


def test_there_is_no_import_circle() -> None:
    edges = graph()
    circles: list[list[str]] = []

    def walk(name: str, path: list[str]) -> None:
        for other in sorted(edges[name]):
            if other in path:
                circles.append([*path[path.index(other) :], other])
            elif other not in done:
                walk(other, [*path, other])
        done.add(name)

    done: set[str] = set()
    for start in sorted(edges):
        if start not in done:
            walk(start, [start])
    assert circles == []


def test_the_import_graph_sees_imports_inside_functions_and_skips_type_checking_ones(
    tmp_path: Path,
) -> None:
    module = tmp_path / "plain.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..settings.config import LeaseOptions\n"
        "def f():\n    from .aio import AsyncHold\n"
        "    from .. import store\n    from ..base import clock\n"
        "    from ..store.wire import call\n"
    )
    assert _imports("holds.plain", module) == {"holds.aio", "store", "base.clock", "store.wire"}


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_is_longer_than_its_budget(name: str) -> None:
    assert len(modules()[name].read_text().splitlines()) <= MAX_LINES


def _is_store_module(receiver: ast.expr) -> bool:
    """``topology.scan(...)``: a function of the store, not a client's method."""
    names = {"store", *(n.split(".")[1] for n in modules() if n.startswith("store."))}
    return isinstance(receiver, ast.Name) and receiver.id in names


def test_no_module_outside_the_store_sends_a_redis_command() -> None:
    sent = []
    for name, path in modules().items():
        if name.startswith("store."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COMMANDS
                and not _is_store_module(node.func.value)
                and (name, node.func.attr) not in ALLOWED
            ):
                sent.append(f"{name}:{node.lineno} .{node.func.attr}()")
    assert sent == []


def _map() -> dict[str, str]:
    """The package docstring's map: its first word (``core/``, ``errors``) -> the rest."""
    doc = celery_lease.__doc__ or ""
    block = doc[doc.index("::\n") + 3 :]
    found: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        if not line.strip():
            continue
        if line[4] != " ":  # a new entry
            current, _, rest = line.strip().partition(" ")
            found[current.rstrip("/")] = rest
        else:
            found[current.rstrip("/")] += " " + line.strip()
    return found


@pytest.mark.parametrize("name", sorted(modules()))
def test_the_package_map_names_every_module(name: str) -> None:
    drawn = _map()
    parts = name.split(".")
    if len(parts) == 1:  # a subpackage's __init__, or a root module
        assert parts[0] in drawn or parts[0] in drawn.get("(root)", ""), name
    else:
        words = set(re.findall(r"\w+", drawn.get(parts[0], "")))
        missing = [part for part in parts[1:] if part not in words]
        assert missing == [], f"{name}: not in the map's line for {parts[0]}/"


#: The policies' shared interface and the one place that composes them: not policies.
POLICY_FRAME = {"policies", "policies.base", "policies.compose"}


def _unit(name: str) -> str | None:
    """The policy unit a module belongs to (``policies.handoff.waiting`` -> ``handoff``)."""
    if not name.startswith("policies.") or name in POLICY_FRAME:
        return None
    return name.split(".")[1]


def test_no_policy_imports_another_policy() -> None:
    crossing = [
        f"{name} imports {other}"
        for name, deps in graph().items()
        for other in deps
        if _unit(name) and _unit(other) and _unit(other) != _unit(name)
    ]
    assert crossing == []


def test_the_core_and_the_task_import_no_policy() -> None:
    importers = [n for n in modules() if n.startswith("core.") or n == "execution.task"]
    found = [f"{n} imports {o}" for n in importers for o in graph()[n] if _unit(o)]
    assert found == []
