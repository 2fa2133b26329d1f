"""The Redis commands each feature sends, and whether the store's ACL user may send them.

One list for everything that speaks of permissions: the ACL rule in docs/deploying.md
(``tests/test_deploying_docs.py`` fails when the page differs from :func:`setuser`), the
rule ``celery lease acl`` prints, the worker's start check and ``celery lease doctor``
(:func:`denied`), and the ACL users of the tests (``tests/support/secure.py``).

A feature's commands are those it sends itself and, for each script it runs, ``EVALSHA`` and
``EVAL`` (a server that lost its scripts gets them by ``EVAL``, never ``SCRIPT LOAD``) and
every ``redis.call('X'`` / ``redis.pcall('X'`` in the script's assembled source (Redis checks
a script's commands against the user's ACL as it runs them): a command added to a script is
in the list without anyone writing it down. Keys: every command names keys under a
``lease_key_prefix`` (``~<prefix>:*``). Channels: only ``preempt`` publishes and subscribes,
on ``<prefix>:preempt:*`` (:attr:`Feature.channels`, ``&<prefix>:preempt:*`` in the rule);
without it the rule grants none (``reset`` leaves none).

Checking without running: :func:`denied` asks the server, in one ``EVAL`` of
``scripts/acl/acl_check-1.lua``, whether the user may run each command on a key under each prefix
(``redis.acl_check_cmd``, Redis 7.0 or later); nothing is written. ``ACL DRYRUN`` does the same
but needs an admin permission no lease user should have. An older server cannot answer that
question without running the commands, so :func:`denied` returns ``None`` there.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from . import lua, routing

__all__ = [
    "DEFAULT_FEATURES",
    "FEATURES",
    "PROBE_KEY",
    "Denied",
    "Feature",
    "channels",
    "commands",
    "denied",
    "script_commands",
    "setuser",
]

_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]")


@functools.cache
def script_commands(name: str) -> tuple[str, ...]:
    """The commands script ``name`` (``"lease/release-2.lua"``) calls, lower case, in the order
    they first appear in its assembled source (its includes expanded)."""
    return tuple(dict.fromkeys(c.lower() for c in _CALL.findall(lua.source(name))))


@dataclass(frozen=True)
class Feature:
    """What one feature sends to the lease store.

    Attributes:
        name: the feature's name (``"tasks"``, ``"hold"``...), as :data:`FEATURES` keys it.
        title: what it is, for the documentation and messages.
        sent: the commands it sends itself, lower case, ``|`` before a subcommand.
        scripts: the scripts it runs, by name (``"lease/acquire-4.lua"``).
        channels: the pub/sub channel patterns it publishes or subscribes to, ``{prefix}``
            standing for each ``lease_key_prefix`` (:func:`channels`).
    """

    name: str
    title: str
    sent: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()

    @property
    def commands(self) -> tuple[str, ...]:
        """Every command the feature sends: ``EVALSHA``/``EVAL`` and each script's commands
        when it runs scripts, then :attr:`sent`; lower case, each once."""
        inner = [c for name in self.scripts for c in script_commands(name)]
        scripted = ("evalsha", "eval") if self.scripts else ()
        return tuple(dict.fromkeys((*scripted, *inner, *self.sent)))


#: Every feature, by name, in the order the rule lists them. ``tasks`` underlies the others
#: (a hold, beat's leader lease and the CLI take, renew, release or read leases), so
#: :func:`commands` always includes it. ``database`` and ``cluster`` are the store's, not
#: features one chooses: a database other than 0 is selected on connecting; redis-py's
#: cluster client reads the slot table and the command table, and follows ``ASK``.
FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "tasks",
            "task leases (workers, eager calls): acquire, renew, release; the "
            "redelivery check reads the fencing counter, the start check reads INFO",
            ("get", "info"),
            (
                "lease/acquire-4.lua",
                "lease/renew_many.lua",
                "lease/renew-1.lua",
                "lease/release-2.lua",
                "cooldown/release_cooldown-2.lua",
            ),
        ),
        Feature(
            "handoff",
            "lease_on_conflict 'coalesce' or 'queue': park a duplicate, the release "
            "that hands the key over, the crash sweep's index",
            (),
            (
                "handoff/park-3.lua",
                "handoff/release_handoff-4.lua",
                "handoff/watch-1.lua",
                "handoff/sweep_due-1.lua",
                "handoff/unwatch-1.lua",
            ),
        ),
        Feature(
            "hold",
            "celery_lease.hold and hold_async: the release wakes a waiting hold, "
            "on_conflict='wait' blocks for it, a cancelled waiter passes the turn on",
            ("blpop",),
            ("lease/release_wake-3.lua", "lease/pass_turn-2.lua"),
        ),
        Feature(
            "preempt",
            "lease_on_conflict='preempt': the take-over, the notice published to the "
            "old holder's process (a channel <prefix>:preempt:*, which the ACL user needs as "
            "&<prefix>:preempt:*), and the wait out of lease_preempt_grace",
            ("publish", "subscribe", "blpop"),
            ("preempt/preempt-4.lua", "preempt/wake_preempter-1.lua"),
            ("{prefix}:preempt:*",),
        ),
        Feature(
            "beat",
            "LeasedScheduler: the leader lease and the last-run record, stamped "
            "and read on the store's clock; a stopping leader wakes a standby blocked on "
            "its release",
            ("blpop",),
            ("beat/record_run-1.lua", "beat/last_runs-1.lua", "lease/release_wake-3.lua"),
        ),
        Feature(
            "cli",
            "celery lease ls / show / release: SCAN (never KEYS), value and lifetime "
            "read in one MULTI, the operator's release, the lines of waiting runs",
            ("scan", "multi", "exec", "pttl", "lrange", "hget"),
            ("lease/revoke-1.lua",),
        ),
        Feature("doctor", "celery lease doctor: latency and clock", ("ping", "time", "info")),
        Feature(
            "min_replicas",
            "lease_min_replicas above 0: WAIT after each acquire; a grant the replicas did "
            "not acknowledge is taken back, a handed-over run's key reserved for it again",
            ("wait",),
            ("lease/ungrant-3.lua",),
        ),
        Feature(
            "limit",
            "lease_limit above 1 (and hold(limit=)): the slots of a limited key, "
            "taken, renewed and released one by one, listed by celery lease ls; with a "
            "policy that waits in the key's line, parked and handed over slot by slot; a "
            "cancelled hold_async waiter passes the turn on when a slot is free",
            ("hgetall", "time"),
            (
                "slots/acquire_slot-3.lua",
                "slots/renew_slots.lua",
                "slots/renew_slot-1.lua",
                "slots/release_slot-3.lua",
                "slots/revoke_slot-1.lua",
                "slots/pass_turn_slot-2.lua",
                "handoff/park_slot-2.lua",
                "handoff/release_slot_handoff-4.lua",
            ),
        ),
        Feature(
            "dedupe",
            "lease_dedupe: the waiting copy's claim, decided at publish, cleared by "
            "the acquire that grants it, removed when its message will not run",
            (),
            (
                "dedupe/claim-2.lua",
                "dedupe/confirm-1.lua",
                "lease/acquire-4.lua",
                "dedupe/unclaim-1.lua",
            ),
        ),
        Feature(
            "debounce",
            "lease_debounce: the burst's record, decided at publish, read by its "
            "timer on a worker and by the crash sweep (the hand-over's index notes the key)",
            ("hmget",),
            (
                "debounce/debounce-1.lua",
                "debounce/debounce_fire-1.lua",
                "debounce/debounce_look-1.lua",
                "handoff/watch-1.lua",
                "handoff/sweep_due-1.lua",
                "handoff/unwatch-1.lua",
            ),
        ),
        Feature("database", "a lease_backend database other than 0", ("select",)),
        Feature(
            "cluster",
            "Redis Cluster (redis-py's cluster client)",
            ("cluster|slots", "command", "asking"),
        ),
    )
}

#: The features of the rule docs/deploying.md shows: everything a default configuration uses.
DEFAULT_FEATURES = ("tasks", "hold", "beat", "cli", "doctor")

#: The key every check names, under each prefix: ``<prefix>:{celery-lease:permission-probe}``.
PROBE_KEY = "{celery-lease:permission-probe}"

# How each command is asked about: its words, %k standing for a key under the prefix; a
# command not named here (new in a script) is asked about with a key as its first argument.
_SHAPES = {
    "evalsha": "EVALSHA " + "0" * 40 + " 1 %k",
    "eval": "EVAL return 1 %k",
    "get": "GET %k",
    "set": "SET %k 1",
    "del": "DEL %k",
    "pexpire": "PEXPIRE %k 1",
    "pttl": "PTTL %k",
    "time": "TIME",
    "info": "INFO",
    "rpush": "RPUSH %k 1",
    "blpop": "BLPOP %k 1",
    "hset": "HSET %k f 1",
    "hmget": "HMGET %k f",
    "hdel": "HDEL %k f",
    "lindex": "LINDEX %k 0",
    "lset": "LSET %k 0 1",
    "lpop": "LPOP %k",
    "llen": "LLEN %k",
    "zadd": "ZADD %k 1 m",
    "zrangebyscore": "ZRANGEBYSCORE %k 0 1",
    "zscore": "ZSCORE %k m",
    "zrem": "ZREM %k m",
    "exists": "EXISTS %k",
    "lrange": "LRANGE %k 0 -1",
    "lrem": "LREM %k 1 x",
    "hgetall": "HGETALL %k",
    "scan": "SCAN 0",
    "hget": "HGET %k f",
    "hlen": "HLEN %k",
    "hexists": "HEXISTS %k f",
    "multi": "MULTI",
    "exec": "EXEC",
    "ping": "PING",
    "wait": "WAIT 0 0",
    "select": "SELECT 0",
    "cluster|slots": "CLUSTER SLOTS",
    "command": "COMMAND",
    "asking": "ASKING",
    # %p: the prefix; a channel is checked as the & patterns are (redis.acl_check_cmd does).
    "publish": "PUBLISH %p:preempt:" + PROBE_KEY + " 1",
    "subscribe": "SUBSCRIBE %p:preempt:" + PROBE_KEY,
}
_CHECK = lua.load("acl/acl_check-1.lua")


def _shape(command: str) -> str:
    return _SHAPES.get(command) or f"{command.replace('|', ' ').upper()} %k"


def commands(features: Iterable[str]) -> tuple[str, ...]:
    """Every command of ``features`` (names in :data:`FEATURES`) and of ``tasks``, each once,
    in the order of :data:`FEATURES`.

    Raises:
        KeyError: an unknown feature name.
    """
    wanted = {"tasks", *features}
    unknown = wanted - FEATURES.keys()
    if unknown:
        raise KeyError(f"unknown feature(s) {sorted(unknown)}; known: {sorted(FEATURES)}")
    return tuple(
        dict.fromkeys(c for f in FEATURES.values() if f.name in wanted for c in f.commands)
    )


def channels(features: Iterable[str], prefixes: Iterable[str]) -> list[str]:
    """The pub/sub channel patterns ``features`` need under each of ``prefixes`` (the
    ``lease_key_prefix`` values), each once, sorted: ``["lease:preempt:*"]`` for ``preempt``
    under ``lease``; empty for the others.

    Raises:
        KeyError: an unknown feature name.
    """
    wanted = set(features)
    unknown = wanted - FEATURES.keys()
    if unknown:
        raise KeyError(f"unknown feature(s) {sorted(unknown)}; known: {sorted(FEATURES)}")
    return sorted(
        {c.format(prefix=p) for f in wanted for c in FEATURES[f].channels for p in prefixes}
    )


def setuser(
    user: str,
    password: str,
    features: Iterable[str],
    patterns: Sequence[str],
    channel_patterns: Sequence[str] = (),
) -> str:
    """The ``redis-cli ACL SETUSER`` command giving ``user`` exactly the permissions of
    ``features`` on the key ``patterns`` (``"lease:*"``) and the pub/sub
    ``channel_patterns`` (:func:`channels`, ``&`` each, after ``resetchannels``): one line per
    feature, each adding the commands the features before it did not have, ``\\`` at each
    line's end.

    Raises:
        KeyError: an unknown feature name.
    """
    head = [
        "redis-cli ACL SETUSER",
        user,
        "reset on",
        f"'>{password}'",
        *(f"'~{p}'" for p in patterns),
        # On Redis 6.2 ``reset`` gives every channel (``acl-pubsub-default allchannels``)
        # and a pattern after that is an error; without patterns no pub/sub command is granted.
        *(["resetchannels"] if channel_patterns else []),
        *(f"'&{c}'" for c in channel_patterns),
        "-@all",
    ]
    wanted, seen, lines = {"tasks", *features}, set[str](), []
    for feature in FEATURES.values():
        if feature.name not in wanted:
            continue
        new = [c for c in feature.commands if c not in seen]
        seen.update(new)
        if new:
            lines.append("    " + " ".join(f"+{c}" for c in new))
    return " \\\n".join([" ".join(head), *lines])


@dataclass(frozen=True)
class Denied:
    """Commands the store's user may not run on ``key``, for one feature.

    Attributes:
        feature: the :data:`FEATURES` name.
        commands: the denied commands (lower case, as the rule spells them); empty when the
            user may not touch ``key`` at all (its key patterns do not cover the prefix).
        key: the key they were asked about.
    """

    feature: str
    commands: tuple[str, ...]
    key: str


def denied(client: Any, features: Iterable[str], prefixes: Iterable[str]) -> list[Denied] | None:
    """What the store's user may not run of ``features`` (and ``tasks``) on a key under each
    of ``prefixes``, asked of the server without running anything (see the module docs).

    Returns:
        One :class:`Denied` per feature and prefix that lacks a permission (empty: all
        allowed), or ``None`` when the server cannot be asked (Redis before 7.0, or a server
        without ``redis.acl_check_cmd``).

    Raises:
        redis.exceptions.RedisError: store errors other than a refusal (connection, timeout).
    """
    wanted = {"tasks", *features}
    names = commands(wanted)
    chosen = [f for f in FEATURES.values() if f.name in wanted]
    found: list[Denied] = []
    for prefix in sorted(set(prefixes)):
        key = f"{prefix}:{PROBE_KEY}"
        try:
            node = routing.owner(client, key)
            reply = node.execute_command(
                *_CHECK.args((key,), [_shape(c).replace("%p", prefix) for c in names], by_sha=False)
            )
        except NoPermissionError as exc:  # the probe itself: EVAL, or the key, is refused
            text = str(exc).lower()
            return [Denied("tasks", () if "key" in text else ("eval",), key)]
        except ResponseError:
            return None  # no redis.acl_check_cmd here: nothing can be said
        refused = {names[int(i) - 1] for i in reply}
        found += [
            Denied(f.name, tuple(c for c in f.commands if c in refused), key)
            for f in chosen
            if refused & set(f.commands)
        ]
    return found
