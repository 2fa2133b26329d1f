"""The Lua scripts of the protocol: one file each, loaded once, sent by SHA.

Each script is a file in a folder of ``scripts/`` (package data) named after the policy whose
decision it makes (``lease/``, ``slots/``, ``handoff/``...), the file named after what it does
and the number of keys it takes (``lease/release-2.lua``: two keys; a name without a number
takes any number). A script's name is that path: ``load("lease/release-2.lua")``. Each opens
with a header in a Lua block comment: what it does, one line per ``KEYS[i]`` and ``ARGV[i]``,
and what it returns; ``tests/test_scripts.py`` holds every script to its header, and
docs/reference/scripts.md says why each one is written as it is.

What several scripts share is a file in ``scripts/lib/``: Lua functions (``next_fence``), or a
fragment of a script's own code (the token check). A line that reads ``--@include <file
name>`` (indented or not) is replaced by that file's body, indented as the line was; nothing
else is expanded, so a function is defined where its file is included. The name is a path
under ``lib/``: ``--@include ../lease/release-2.lua`` pastes another script's body the same
way (an including script that wraps it in a function of its own runs it as one). Headers are
dropped from what is sent to Redis (the release is sent as ``EVAL`` with its source on every
execution).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis

from . import wire

__all__ = ["Script", "load", "names", "parts", "source"]

_INCLUDE = re.compile(r"^( *)--@include (\S+)$")
_HEADER = re.compile(r"\A--\[\[\n(.*?)\n\]\]\n", re.S)
_DIR = "scripts"
_LIB = "lib"


def _read(path: str) -> str:
    found = resources.files(__package__).joinpath(_DIR)
    for part in path.split("/"):  # one part per call: Python 3.10's joinpath takes one
        found = found.joinpath(part)
    return found.read_text("utf-8")


def _expand(body: str, seen: tuple[str, ...]) -> str:
    lines = []
    for line in body.splitlines(keepends=True):
        found = _INCLUDE.match(line.rstrip("\n"))
        if found is None:
            if "--@include" in line:  # a tab, trailing blanks: never dropped in silence
                raise ValueError(
                    f"{line.strip()!r} is not an include line: write it as "
                    f"'--@include <file name>', indented with spaces only"
                )
            lines.append(line)
            continue
        indent, name = found.groups()
        if name in seen:
            raise ValueError(f"scripts/{_LIB}/{name} includes itself")
        path = f"{_LIB}/{name}"
        fragment = _expand(parts(path)[1], (*seen, name))
        lines += [
            indent + part if part.strip() else part for part in fragment.splitlines(keepends=True)
        ]
    return "".join(lines)


def names() -> list[str]:
    """The name of every script (``"lease/release-2.lua"``: ``scripts/<folder>/*.lua``, not
    ``lib/``), sorted."""
    scripts = resources.files(__package__).joinpath(_DIR)
    return sorted(
        f"{folder.name}/{p.name}"
        for folder in scripts.iterdir()
        if folder.is_dir() and folder.name != _LIB
        for p in folder.iterdir()
        if p.name.endswith(".lua")
    )


@functools.cache
def source(name: str) -> str:
    """The source sent to Redis for script ``name`` (``"lease/release-2.lua"``): its body with
    each ``--@include`` line replaced by the included file's body, headers left out.

    Raises:
        ValueError: the script or a fragment it includes has no header, or an include loops.
        FileNotFoundError: no such script or fragment.
    """
    return _expand(parts(name)[1], ())


def parts(path: str) -> tuple[str, str]:
    """``(header, body)`` of ``scripts/<path>`` (``"lease/release-2.lua"``, ``"lib/held.lua"``)
    as written: the header without its ``--[[``/``]]`` lines, the body with its ``--@include``
    lines (what ``tests/test_scripts.py`` holds to the header).

    Raises:
        ValueError: the file does not open with a ``--[[ ... ]]`` header.
        FileNotFoundError: no such file.
    """
    text = _read(path)
    found = _HEADER.match(text)
    if found is None:
        raise ValueError(
            f"celery_lease/store/{_DIR}/{path} has no header: it must open with "
            f"a '--[[' block (what it does, KEYS, ARGV, Returns) closed by ']]'"
        )
    return found.group(1), text[found.end() :]


class Script:
    """A Lua script sent by SHA, loaded on ``NOSCRIPT`` (e.g. after a server restart).

    redis-py's own ``Script`` in a pipeline checks ``SCRIPT EXISTS`` before every execute, an
    extra round trip on the renewal path; this sends ``EVALSHA`` and reloads only on demand.
    On a standalone client it uses :func:`celery_lease.store.wire.call`, on the others
    ``execute_command``.

    Attributes:
        name: the script's name, its path under ``scripts/`` (str).
        source: what is sent to Redis (str, see :func:`source`).
        sha: its SHA1, hex (str).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = source(name)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def args(
        self, keys: Sequence[str], argv: Sequence[Any], by_sha: bool = True
    ) -> tuple[Any, ...]:
        """The ``EVALSHA`` command for ``keys`` and ``argv``; ``by_sha=False``: ``EVAL`` with the
        source, which also caches the script on the server that runs it."""
        if by_sha:
            return ("EVALSHA", self.sha, len(keys), *keys, *argv)
        return ("EVAL", self.source, len(keys), *keys, *argv)

    def __call__(self, client: Any, keys: Sequence[str], argv: Sequence[Any]) -> Any:
        """Run the script on ``client``; returns its reply.

        Raises:
            redis.exceptions.RedisError: as the command raised it.
        """
        send = (
            functools.partial(wire.call, client) if wire.usable(client) else client.execute_command
        )
        try:
            return send(*self.args(keys, argv))
        except redis.exceptions.NoScriptError:
            return send(*self.args(keys, argv, by_sha=False))


@functools.cache
def load(name: str) -> Script:
    """The :class:`Script` of ``scripts/<name>`` (``"lease/release-2.lua"``), read once per
    process.

    Raises:
        ValueError, FileNotFoundError: as :func:`source`.
    """
    return Script(name)
