"""The stored value of a lease key: ``<token>:<fencing token>:<holder JSON>``, and how a reader
recognises it.

The token is what every script compares; the fencing token and the holder (task, task id,
host, pid) are there for successors and operators: the conflict reply, ``celery lease ls``,
the skip marker and events. The holder JSON carries the format's version, ``"v"``
(:data:`FORMAT_VERSION`; a value without one was written by a version before the marker, the
same format).

Whatever is read back is parsed defensively (:func:`parse_value` never raises): the lease
prefix may be shared with another tool, or a key damaged by hand. A value this library did not
write is a lease held by an *unknown holder* (:attr:`Holder.foreign` says why): the scripts
never overwrite it (``SET NX``) nor delete it (every delete is token-checked), and the caller
treats it as any conflict. A value of a later format version is read for the fields it shares
with this one. docs/concepts.md ("What is stored, and how a reader recognises it") lists every
stored format.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "MAX_FENCE",
    "TOKEN_LENGTH",
    "Holder",
    "OtherType",
    "granted_holder",
    "holder_json",
    "new_token",
    "parse_counter",
    "parse_fence",
    "parse_value",
    "unknown",
]

#: The version of the lease value this library writes: the ``"v"`` of the holder JSON.
FORMAT_VERSION = 1
#: Characters of a token: 16 random bytes in lowercase hex.
TOKEN_LENGTH = 32
#: Fencing tokens stay below 2**53: the scripts count in Lua numbers (doubles), exact only
#: up to there; a counter at or above it cannot be incremented exactly and is not ours.
MAX_FENCE = 2**53 - 1


def new_token() -> str:
    """A fresh holder token: :data:`TOKEN_LENGTH` random lowercase hex characters (str).

    From ``os.urandom``: unguessable, so no other holder can release or renew this lease by
    accident or by design; ``uuid4().hex`` would give as many bits at five times the cost.
    """
    return os.urandom(16).hex()


# The longest holder JSON read (characters): this library writes about 200 (more only for
# task names of hundreds of escaped characters); a longer one is not parsed at all (a huge
# tail is someone else's, and costs time; a deeply nested one is refused by json itself).
_MAX_META = 65536
_HEX = frozenset("0123456789abcdef")
_FOREIGN = "not a value celery-lease writes"


@dataclass(frozen=True)
class OtherType:
    """A key of another Redis type than a string where a string was expected (``WRONGTYPE``).

    Attributes:
        kind: the key's type as ``TYPE`` names it (``"hash"``, ``"list"``...).
    """

    kind: str


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, parsed from the stored value.

    Attributes:
        token: the holder's per-execution token (str; empty for an unknown holder).
        fencing_token: int (0 for an unknown holder).
        task_name, task_id, hostname: str (empty when unknown).
        pid: int (0 when unknown).
        version: the stored format's version (int; 0 for an unknown holder).
        foreign: empty for a value celery-lease wrote (this version or another); otherwise why
            the value is not one (str): the lease is held by an unknown holder.
        cooldown_until: for a cooldown record (``lease_cooldown``, written by the release of
            the execution named here), when it ends: float seconds since the epoch on the
            store's clock; 0.0 for a lease held by a running execution.
    """

    token: str
    fencing_token: int
    task_name: str = ""
    task_id: str = ""
    hostname: str = ""
    pid: int = 0
    version: int = FORMAT_VERSION
    foreign: str = ""
    cooldown_until: float = 0.0

    @property
    def where(self) -> str:
        """``"hostname:pid"``; ``"unknown holder"`` for a value celery-lease did not write."""
        return "unknown holder" if self.foreign else f"{self.hostname}:{self.pid}"


def granted_holder(token: str, fencing_token: int) -> Holder:
    """``Holder(token, fencing_token)``: what a fresh grant knows of its own holder.

    Built without the frozen dataclass's ``__init__`` (one ``object.__setattr__`` call per
    field: a tenth of an execution's Python on the acquire path); the result is the same
    object, every field in its ``__dict__``, the others at their defaults (a test compares
    the two).
    """
    holder: Holder = object.__new__(Holder)
    holder.__dict__.update(_HOLDER_DEFAULTS, token=token, fencing_token=fencing_token)
    return holder


#: Every field of :class:`Holder` but the two a grant sets, at its default.
_HOLDER_DEFAULTS = {
    f.name: f.default for f in fields(Holder) if f.name not in ("token", "fencing_token")
}


def unknown(why: str) -> Holder:
    """The :class:`Holder` of a value celery-lease did not write (``why``: what was found)."""
    return Holder("", 0, version=0, foreign=why)


def holder_json(task_name: str, task_id: str, hostname: str, pid: int) -> str:
    """The holder description stored in the lease value (compact JSON, ASCII only)."""
    if type(task_name) is type(task_id) is type(hostname) is str and type(pid) is int:
        # What json.dumps writes for these types, without its generic machinery (one call per
        # execution: an eighth of the cost).
        return (
            f'{{"v":{FORMAT_VERSION},"task":{_json_str(task_name)},'
            f'"id":{_json_str(task_id)},"host":{_json_str(hostname)},"pid":{pid}}}'
        )
    return json.dumps(
        {"v": FORMAT_VERSION, "task": task_name, "id": task_id, "host": hostname, "pid": pid},
        separators=(",", ":"),
    )


def parse_fence(text: str) -> int | None:
    """The fencing token ``text`` spells (ASCII digits, below 2**53), else None."""
    if not 0 < len(text) <= 16 or not text.isascii() or not text.isdigit():
        return None
    number = int(text)
    return number if number <= MAX_FENCE else None


def parse_counter(value: Any) -> int | None:
    """The count a fencing counter's stored value starts with, else None (not ours).

    The counter reads ``<digits>``, ``<digits>:<token>`` or ``<digits>;<token>``; as in
    ``lease/acquire-4.lua``, whatever follows the leading digits is left to the version that wrote
    it, and digits at or above :data:`MAX_FENCE` are refused (no exact next token).
    """
    if isinstance(value, str):
        value = value.encode("utf-8", "replace")
    if not isinstance(value, bytes):
        return None
    digits = value[: len(value) - len(value.lstrip(b"0123456789"))]
    if not digits:
        return None
    digits = digits.lstrip(b"0") or b"0"
    if len(digits) > 16 or int(digits) >= MAX_FENCE:
        return None
    return int(digits)


def _is_int(value: Any) -> bool:
    return type(value) is int


def parse_value(value: Any) -> Holder:
    """Parse a stored lease value (bytes, str, or an :class:`OtherType` read where one was
    expected) into a :class:`Holder`; never raises.

    A value is celery-lease's when it reads ``<32 hex>:<digits>:<JSON object>`` whose
    ``"v"`` (absent: 1) is a positive int and whose ``task``, ``id``, ``host`` (str) and
    ``pid`` (int) have their types; anything else, including bytes that are not UTF-8, is an
    unknown holder (:func:`unknown`).
    """
    if isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return unknown(f"{_FOREIGN} (not UTF-8 text)")
    elif isinstance(value, str):
        text = value
    elif isinstance(value, OtherType):
        return unknown(f"a Redis {value.kind}, not a lease value")
    else:
        return unknown(f"{_FOREIGN} ({type(value).__name__})")
    token, _, rest = text.partition(":")
    fence_text, sep, meta = rest.partition(":")
    fence = parse_fence(fence_text)
    if len(token) != TOKEN_LENGTH or not _HEX.issuperset(token) or fence is None or not sep:
        return unknown(_FOREIGN)
    info = _holder_info(meta)
    if info is None:
        return unknown(f"{_FOREIGN} (its holder JSON)")
    return Holder(token, fence, *info[0], cooldown_until=info[1])


def _holder_fields(meta: str) -> tuple[str, str, str, int, int] | None:
    """``(task, id, host, pid, version)`` from the holder JSON, or None when it is not ours."""
    info = _holder_info(meta)
    return None if info is None else info[0]


def _holder_info(meta: str) -> tuple[tuple[str, str, str, int, int], float] | None:
    """:func:`_holder_fields` and a cooldown record's end (float epoch seconds, 0.0 for a
    running holder's value), or None when the holder JSON is not ours."""
    if len(meta) > _MAX_META:
        return None
    try:
        info = json.loads(meta)
    except (ValueError, RecursionError):  # huge numbers are a ValueError too
        return None
    if not isinstance(info, dict):
        return None
    version, pid = info.get("v", 1), info.get("pid", 0)
    until = info.get("cooldown_until_ms", 0)
    strings = [info.get(name, "") for name in ("task", "id", "host")]
    if not (
        _is_int(version)
        and version >= 1
        and _is_int(pid)
        and 0 <= pid <= 2**32
        and all(isinstance(s, str) for s in strings)
        and _is_int(until)
        and until >= 0
    ):
        return None
    return (strings[0], strings[1], strings[2], pid, version), until / 1000
