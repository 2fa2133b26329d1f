"""Lease keys: which arguments identify "the same job", and how they become a Redis key.

A key is ``<prefix>:{<task name>:<digest>}``. The digest is a BLAKE2b hash of the *canonical*
arguments: bound to the task's real signature (so ``f(1, 2)``, ``f(1, b=2)`` and ``f(b=2, a=1)``
agree), defaults applied, then encoded by type, so that ``1``, ``"1"``, ``True`` and ``1.0``
differ while a tuple equals a list (as after a JSON round trip). Sets and dict keys are ordered
by their encoding, which does not depend on ``PYTHONHASHSEED``. The braces are the Redis
Cluster hash tag: every key one lease touches (the lease and its fencing counter) shares it.

This module owns every key the library writes:

- a lease key, ``<prefix>:{...}`` (:func:`build_key`, :func:`beat_leader_key`);
- its fencing counter, ``<lease key>:fence`` (:func:`fence_key`), which also notes the token of
  the last execution that released it (``<counter>:<token>``; after the next grant
  ``<counter>;<token>``, for a repeat of that release only);
- the beat leader's record of last runs, ``<leader key>:last-run`` (:func:`last_run_key`);
- a hold's key, ``<prefix>:{hold:<name>}`` (:func:`hold_key`), and the short-lived list its
  release pushes to wake a waiting hold, ``<hold key>:wake`` (:func:`wake_key`);
- the claim of a waiting copy (``lease_dedupe``), ``<lease key>:waiting`` (:func:`claim_key`):
  which published message of the key has not started yet.
- for tasks that hand the key over (``lease_on_conflict`` ``"coalesce"`` or ``"queue"``): the
  key's line of waiting runs, ``<lease key>:line`` (:func:`line_key`), the reservation a
  release hands the key over with, ``<lease key>:reserved`` (:func:`reservation_key`), and the
  crash sweep's index of keys to look at, ``<prefix>:{celery-lease:handoff}:index``
  (:func:`handoff_index_key`, a hash tag of its own).

:data:`INTERNAL_SUFFIXES` lists the suffixes of the keys that are not leases, for tools that
scan a prefix (``celery lease ls``).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import LeaseConfigError, LeaseKeyError
from .key_encoding import Unencodable, encode, encode_value, tagged

__all__ = [
    "BEAT_TASK_NAME",
    "BURST_SUFFIX",
    "CLAIM_SUFFIX",
    "DEFAULT_PREFIX",
    "FENCE_SUFFIX",
    "INDEX_SUFFIX",
    "INTERNAL_SUFFIXES",
    "LAST_RUN_SUFFIX",
    "LINE_SUFFIX",
    "RESERVED_SUFFIX",
    "WAKE_SUFFIX",
    "KeySpec",
    "beat_leader_key",
    "build_key",
    "burst_key",
    "claim_key",
    "encode_value",
    "fence_key",
    "handoff_index_key",
    "hold_key",
    "hold_name",
    "is_internal",
    "last_run_key",
    "line_key",
    "reservation_key",
    "run_signature",
    "validate_lease_key",
    "wake_key",
]

#: The default ``lease_key_prefix``.
DEFAULT_PREFIX = "lease"
#: The task name recorded as the holder of a beat leader lease (``celery lease ls`` shows it).
BEAT_TASK_NAME = "celery.beat"
#: The suffixes of the keys written beside a lease: its fencing counter, a beat leader's
#: last-run record, a hold's wake list, the claim of a task's waiting copy.
FENCE_SUFFIX, LAST_RUN_SUFFIX, WAKE_SUFFIX = ":fence", ":last-run", ":wake"
CLAIM_SUFFIX = ":waiting"
#: The suffix of a key's debounce burst record (``lease_debounce``).
BURST_SUFFIX = ":burst"
#: The suffixes of a key's line of waiting runs, its hand-over reservation, and the sweep index.
LINE_SUFFIX, RESERVED_SUFFIX, INDEX_SUFFIX = ":line", ":reserved", ":index"
#: Suffixes of the keys written beside leases that are not leases themselves.
INTERNAL_SUFFIXES = (
    FENCE_SUFFIX,
    LAST_RUN_SUFFIX,
    WAKE_SUFFIX,
    CLAIM_SUFFIX,
    LINE_SUFFIX,
    RESERVED_SUFFIX,
    INDEX_SUFFIX,
    BURST_SUFFIX,
)
#: The task name part of every hold key: ``<prefix>:{hold:<name>}``.
HOLD_PREFIX = "hold:"

#: ``None`` (all arguments), a sequence of parameter names, or a callable returning a string.
KeySpec = None | Sequence[str] | Callable[..., str]

_MAX_NAME = 120  # characters of a task name or custom key kept verbatim


# Per-call work done once per signature and per parameter name instead (bounded: cleared when
# full; signatures are per task class, names per parameter).
_CACHE_LIMIT = 1024
_positional: dict[int, tuple[inspect.Signature, tuple[str, ...] | None]] = {}
_name_tags: dict[str, bytes] = {}


def _positional_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    """The parameter names when each is a plain positional-or-keyword one, else None."""
    found = _positional.get(id(signature))
    if found is None or found[0] is not signature:  # kept in the value: an id is not reused
        params = signature.parameters
        names = (
            tuple(params)
            if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params.values())
            else None
        )
        if len(_positional) >= _CACHE_LIMIT:
            _positional.clear()
        found = _positional[id(signature)] = (signature, names)
    return found[1]


def _name_tag(name: str) -> bytes:
    tag = _name_tags.get(name)
    if tag is None:
        if len(_name_tags) >= _CACHE_LIMIT:
            _name_tags.clear()
        tag = _name_tags[name] = tagged(b"p", name.encode())
    return tag


def _bind(
    signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any], task_name: str
) -> dict[str, Any]:
    names = _positional_names(signature)
    if not kwargs and names is not None and len(args) == len(names):
        # The common case, without Signature.bind's general machinery.
        return dict(zip(names, args, strict=True))
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise LeaseKeyError(
            f"task {task_name}: arguments do not fit its signature: {exc}"
        ) from None
    bound.apply_defaults()
    return dict(bound.arguments)


def _digest(pairs: Iterable[tuple[str, Any]], task_name: str) -> str:
    # One buffer hashed once: the same digest as one update per piece, for less per call.
    out: list[bytes] = []
    for name, value in pairs:
        try:
            out.append(_name_tag(name))
            encode(value, out)
        except RecursionError:
            raise LeaseKeyError(
                f"task {task_name}: argument {name!r} contains itself (or is nested too deeply) "
                f"and has no stable lease key encoding; leave it out with lease_key=(...names...)"
            ) from None
        except Unencodable as exc:
            raise LeaseKeyError(
                f"task {task_name}: argument {name!r} of type {type(exc.value).__qualname__} has "
                f"no stable lease key encoding; pass a JSON-like value (str, int, float, bool, "
                f"None, list, dict, set, bytes, UUID, datetime, Decimal), leave it out with "
                f"lease_key=(...names...), or give lease_key a callable"
            ) from None
    return hashlib.blake2b(b"".join(out), digest_size=16).hexdigest()


def _bounded(text: str) -> str:
    """``text`` fit for the inside of a hash tag: no braces, and of bounded length."""
    if "{" in text or "}" in text:  # a brace would move the hash tag (Redis Cluster slots)
        text = text.replace("{", "(").replace("}", ")") + "~" + _short_hash(text)
    if len(text) <= _MAX_NAME:
        return text
    return text[:_MAX_NAME] + "~" + _short_hash(text)


def _short_hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def build_key(
    prefix: str,
    task_name: str,
    signature: inspect.Signature,
    spec: KeySpec,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> str:
    """The lease key for one call of a task.

    Args:
        prefix: ``lease_key_prefix``.
        task_name: the registered task name.
        signature: the task's real signature, without ``self`` (``inspect.signature(task.run)``).
        spec: the task's ``lease_key`` option.
        args, kwargs: the call's arguments, as the worker received them.

    Returns:
        A key of bounded length (under 300 characters whatever the arguments).

    Raises:
        LeaseKeyError: the arguments do not fit the signature, an argument in the key cannot be
            encoded stably, a ``lease_key`` callable does not take the call's arguments, or it
            did not return a non-empty string.
        Exception: whatever a ``lease_key`` callable's own body raises, unchanged (a
            ``TypeError`` bug inside it included).
    """
    if callable(spec):
        try:
            custom = spec(*args, **kwargs)
        except TypeError as exc:
            tb = exc.__traceback__
            if tb is not None and tb.tb_next is not None:
                # Raised inside the callable's body (a frame below this one): its own bug,
                # left as it is with its traceback, and said where it came from.
                add_note = getattr(exc, "add_note", None)  # Python 3.11+
                if add_note is not None:
                    add_note(f"raised by the lease_key callable of task {task_name}")
                raise
            raise LeaseKeyError(
                f"task {task_name}: the lease_key callable does not take the task's arguments: "
                f"{exc}; give it the task's parameters (or *args, **kwargs)"
            ) from None
        if not isinstance(custom, str) or not custom:
            raise LeaseKeyError(
                f"task {task_name}: lease_key callable returned {custom!r}; it must return a "
                f"non-empty string"
            )
        return f"{prefix}:{{{_bounded(custom)}}}"
    bound = _bind(signature, args, kwargs, task_name)
    names = list(bound) if spec is None else list(spec)
    if not names and spec is not None:
        return f"{prefix}:{{{_bounded(task_name)}}}"
    digest = _digest(((n, bound[n]) for n in names), task_name)
    return f"{prefix}:{{{_bounded(task_name)}:{digest}}}"


def fence_key(key: str) -> str:
    """The key of the fencing counter that goes with lease ``key`` (same hash tag)."""
    return key + FENCE_SUFFIX


def claim_key(key: str) -> str:
    """The claim of lease ``key``'s waiting copy (``lease_dedupe``; same hash tag)."""
    return key + CLAIM_SUFFIX


def burst_key(key: str) -> str:
    """The record of lease ``key``'s debounce burst (``lease_debounce``; same hash tag)."""
    return key + BURST_SUFFIX


def beat_leader_key(prefix: str, app_name: str) -> str:
    """The default beat leader lease key of the app named ``app_name`` (``app.main``)."""
    return f"{prefix}:{{{BEAT_TASK_NAME}:{app_name}}}"


def last_run_key(leader_key: str) -> str:
    """The hash in which beat leaders record each entry's last send (same hash tag)."""
    return leader_key + LAST_RUN_SUFFIX


def is_internal(key: str) -> bool:
    """True for a key the library writes beside leases (a fencing counter, beat state)."""
    return key.endswith(INTERNAL_SUFFIXES)


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise LeaseKeyError(f"{what} {name!r} must be a non-empty str, e.g. 'invoice:42'")
    if "{" in name or "}" in name:
        raise LeaseKeyError(
            f"{what} {name!r} contains a brace: braces are reserved for the Redis Cluster hash "
            f"tag; use another character, or build the name with hold_name(label, *values)"
        )
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        raise LeaseKeyError(
            f"{what} {name!r} contains a control character; use printable text, or build the "
            f"name with hold_name(label, *values)"
        )
    return name


def hold_key(prefix: str, name: str) -> str:
    """The lease key of ``celery_lease.hold(name)``: ``<prefix>:{hold:<name>}``.

    A name over 120 characters is cut and suffixed with a hash of the whole (still unique).

    Raises:
        LeaseKeyError: ``name`` is empty, not a str, or contains a brace or a control character.
    """
    _check_name(name, "hold name")
    return f"{prefix}:{{{_bounded(HOLD_PREFIX + name)}}}"


def hold_name(label: str, *values: Any, **named: Any) -> str:
    """A hold name built from values with the type-aware encoding task keys use.

    ``hold_name("invoice", 42)`` is ``"invoice:<digest>"``; ``42``, ``"42"``, ``42.0`` and
    ``True`` give different names, a tuple and a list the same one, and the digest does not
    depend on ``PYTHONHASHSEED``. Keyword values count by name, in any order.

    Args:
        label: the readable part (no braces or control characters).
        values, named: the values that identify the resource (str, int, float, bool, None,
            bytes, list, tuple, dict, set, UUID, datetime, date, time, timedelta, Decimal).

    Raises:
        LeaseKeyError: a bad label, or a value with no stable encoding.
    """
    _check_name(label, "hold_name label")
    pairs = [(str(i), v) for i, v in enumerate(values)] + sorted(named.items())
    h = hashlib.blake2b(digest_size=16)
    for name, value in pairs:
        try:
            h.update(tagged(b"p", name.encode()) + encode_value(value))
        except (Unencodable, RecursionError):
            raise LeaseKeyError(
                f"hold_name({label!r}): value {name} of type {type(value).__qualname__} has no "
                f"stable encoding; pass str, int, float, bool, None, bytes, list, tuple, dict, "
                f"set, UUID, datetime, date, time, timedelta or Decimal values"
            ) from None
    return f"{label}:{h.hexdigest()}"


def wake_key(key: str) -> str:
    """The list a hold's release pushes to, to wake holds waiting for ``key`` (same hash tag)."""
    return key + WAKE_SUFFIX


def line_key(key: str) -> str:
    """The list of runs waiting for lease ``key`` (coalesce, queue; same hash tag)."""
    return key + LINE_SUFFIX


def reservation_key(key: str) -> str:
    """The hash a hand-over release reserves lease ``key`` with (same hash tag)."""
    return key + RESERVED_SUFFIX


def handoff_index_key(prefix: str) -> str:
    """The crash sweep's sorted set of lease keys under ``prefix`` that may have runs waiting.

    Its own hash tag: on Redis Cluster it lives on one node, the leases on all of them; it is
    only a hint of where to look (each look decides on the lease's own node).
    """
    return f"{prefix}:{{celery-lease:handoff}}{INDEX_SUFFIX}"


def validate_lease_key(spec: Any, parameters: Callable[[], list[str]], where: str) -> None:
    """Check a ``lease_key`` task option at registration.

    Args:
        spec: ``None``, a sequence of parameter names, or a callable.
        parameters: returns the task's parameter names (called only when needed).

    Raises:
        LeaseConfigError: a string, a non-sequence, or a name the task does not take.
    """
    if spec is None or callable(spec):
        return
    if isinstance(spec, (str, bytes)) or not isinstance(spec, (list, tuple)):
        raise LeaseConfigError(
            f"lease_key={spec!r} ({where}) must be None, a callable, or a list/tuple of "
            f"parameter names, e.g. lease_key=({spec!r},)"
        )
    known = parameters()
    for name in spec:
        if name not in known:
            raise LeaseConfigError(
                f"lease_key names {name!r} ({where}), which is not a parameter of the task; "
                f"its parameters are {known}"
            )


def run_signature(task_cls: type) -> inspect.Signature:
    """The signature of ``task_cls.run`` without ``self`` (through any ``functools.wraps``
    wrapper): what a call's arguments are bound to for its lease key."""
    run = inspect.getattr_static(task_cls, "run")
    if isinstance(run, staticmethod):
        return inspect.signature(run.__func__)
    sig = inspect.signature(run)
    params = list(sig.parameters.values())[1:]  # a plain function in the class: drop `self`
    return sig.replace(parameters=params)
