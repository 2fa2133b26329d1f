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
    # bool before int: True must not equal 1.
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):
        out.append(b"T" if value else b"F")
    elif isinstance(value, int):
        out.append(tagged(b"i", str(value).encode()))
    elif isinstance(value, float):
        out.append(tagged(b"f", repr(value).encode()))
    elif isinstance(value, str):
        out.append(tagged(b"s", value.encode("utf-8", "surrogatepass")))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        out.append(tagged(b"b", bytes(value)))
    elif isinstance(value, (list, tuple)):
        out.append(b"l" + str(len(value)).encode() + b"[")
        for item in value:
            encode(item, out)
        out.append(b"]")
    elif isinstance(value, Mapping):
        items = sorted((encode_value(k), encode_value(v)) for k, v in value.items())
        out.append(b"d" + str(len(items)).encode() + b"{")
        for k, v in items:
            out.append(k)
            out.append(v)
        out.append(b"}")
    elif isinstance(value, (set, frozenset)):
        members = sorted(encode_value(v) for v in value)
        out.append(b"e" + str(len(members)).encode() + b"{" + b"".join(members) + b"}")
    elif isinstance(value, uuid.UUID):
        out.append(tagged(b"u", value.hex.encode()))
    elif isinstance(value, _dt.datetime):
        out.append(tagged(b"t", value.isoformat().encode()))
    elif isinstance(value, _dt.date):
        out.append(tagged(b"D", value.isoformat().encode()))
    elif isinstance(value, _dt.time):
        out.append(tagged(b"h", value.isoformat().encode()))
    elif isinstance(value, _dt.timedelta):
        out.append(tagged(b"w", repr(value.total_seconds()).encode()))
    elif isinstance(value, decimal.Decimal):
        out.append(tagged(b"m", str(value).encode()))
    else:
        raise Unencodable(value)
