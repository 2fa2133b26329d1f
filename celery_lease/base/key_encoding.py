"""The canonical byte encoding of a task's argument values, from which lease keys are hashed
(:mod:`celery_lease.base.keys`): by type, so that ``1``, ``"1"``, ``True`` and ``1.0`` differ while
a tuple equals a list (as after a JSON round trip); sets and dict keys ordered by their encoding,
which does not depend on ``PYTHONHASHSEED``."""

from __future__ import annotations

import datetime as _dt
import decimal
import uuid
from collections.abc import Mapping
from typing import Any

__all__ = ["Unencodable", "encode", "encode_value", "tagged"]


class Unencodable(Exception):
    """An argument value with no stable encoding (its ``value``)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def encode_value(value: Any) -> bytes:
    """The canonical byte encoding of one argument value.

    Raises:
        Unencodable: a type with no stable encoding (:func:`celery_lease.base.keys.build_key`
            raises :class:`~celery_lease.errors.LeaseKeyError` for it).
    """
    out: list[bytes] = []
    encode(value, out)
    return b"".join(out)


def tagged(tag: bytes, payload: bytes) -> bytes:
    """``payload`` behind its type ``tag`` and its length."""
    return b"%b%d:%b" % (tag, len(payload), payload)


def encode(value: Any, out: list[bytes]) -> None:
    """Append the canonical encoding of ``value`` to ``out``.

    Raises:
        Unencodable: a type with no stable encoding.
    """
    # The order of the checks is part of the encoding: bool before int (True must not equal 1),
    # and the containers before the standard library's value types.
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):
        out.append(b"T" if value else b"F")
    elif isinstance(value, (int, float, str, bytes, bytearray, memoryview)):
        out.append(_scalar(value))
    elif isinstance(value, (list, tuple)):
        _encode_sequence(value, out)
    elif isinstance(value, Mapping):
        _encode_mapping(value, out)
    elif isinstance(value, (set, frozenset)):
        members = sorted(encode_value(v) for v in value)
        out.append(b"e" + str(len(members)).encode() + b"{" + b"".join(members) + b"}")
    else:
        out.append(_standard_value(value))


def _scalar(value: int | float | str | bytes | bytearray | memoryview) -> bytes:
    """The tagged encoding of an int (not a bool), float, str or bytes-like ``value``: a float
    by its ``repr`` (exact), a str in UTF-8 with lone surrogates kept."""
    if isinstance(value, int):
        return tagged(b"i", str(value).encode())
    if isinstance(value, float):
        return tagged(b"f", repr(value).encode())
    if isinstance(value, str):
        return tagged(b"s", value.encode("utf-8", "surrogatepass"))
    return tagged(b"b", bytes(value))


def _encode_sequence(value: list[Any] | tuple[Any, ...], out: list[bytes]) -> None:
    """Append a list's or tuple's encoding (the same for both, as after a JSON round trip):
    its length, then each item's in order."""
    out.append(b"l" + str(len(value)).encode() + b"[")
    for item in value:
        encode(item, out)
    out.append(b"]")


def _encode_mapping(value: Mapping[Any, Any], out: list[bytes]) -> None:
    """Append a mapping's encoding: its length, then each key's and value's, the pairs ordered
    by their encoding (not by insertion, nor by hash)."""
    items = sorted((encode_value(k), encode_value(v)) for k, v in value.items())
    out.append(b"d" + str(len(items)).encode() + b"{")
    for k, v in items:
        out.append(k)
        out.append(v)
    out.append(b"}")


def _standard_value(value: Any) -> bytes:
    """The tagged encoding of a UUID, datetime, date, time, timedelta (its float seconds) or
    Decimal ``value``.

    Raises:
        Unencodable: any other type.
    """
    if isinstance(value, uuid.UUID):
        return tagged(b"u", value.hex.encode())
    if isinstance(value, _dt.datetime):  # before date: a datetime is a date
        return tagged(b"t", value.isoformat().encode())
    if isinstance(value, _dt.date):
        return tagged(b"D", value.isoformat().encode())
    if isinstance(value, _dt.time):
        return tagged(b"h", value.isoformat().encode())
    if isinstance(value, _dt.timedelta):
        return tagged(b"w", repr(value.total_seconds()).encode())
    if isinstance(value, decimal.Decimal):
        return tagged(b"m", str(value).encode())
    raise Unencodable(value)
