"""The package's shape: the layers drawn in ``celery_lease/__init__.py``, no import circle, no
module over its budget (800 lines), and no Redis command built outside ``celery_lease/store/``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import celery_lease

PACKAGE = Path(celery_lease.__file__).parent

#: Module -> layer, bottom (0) to top; ``store`` stands for every module of the subpackage.
LAYERS = {
    **dict.fromkeys(["keys", "key_encoding", "errors", "signals", "clock", "process"], 0),
    "store": 1,
    **dict.fromkeys(
        [
            "config",
            "names",
            "timing",
            "signal_setting",
            "limit",
            "debounce_settings",
            "publish_settings",
        ],
        2,
    ),
    **dict.fromkeys(["lifecycle", "heartbeat", "interrupt", "next_instruction", "lease"], 3),
    **dict.fromkeys(
        [
            "task",
            "conflict",
            "dedupe",
            "handoff",
            "hold",
            "hold_core",
            "hold_async",
            "hold_options",
            "hold_shapes",
            "beat",
            "beat_leader",
            "lease_tasks",
            "eager",
            "outage",
            "cooldown",
            "preempt",
            "publishing",
            "debounce",
            "debounce_eager",
            "accepted",
        ],
        4,
    ),
    **dict.fromkeys(
        [
            "cli",
            "doctor",
            "doctor_claims",
            "finding",
            "inspection",
            "flower",
            "metrics",
            "testing",
            "worker",
            "acl",
            "sweep",
        ],
        5,
    ),
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
ALLOWED = {("testing", "flushall")}


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
    module = tmp_path / "hold.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .config import LeaseOptions\n"
        "def f():\n    from .hold_async import AsyncHold\n"
        "    from . import store, clock\n    from .store.wire import call\n"
    )
    assert _imports("hold", module) == {"hold_async", "store", "clock", "store.wire"}


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
