"""The Redis ACL an app's lease store user needs, and what the user lacks of it.

The commands come from :mod:`celery_lease.store.permissions` (one list, per feature); this
module says which features and key prefixes each store of an app serves, from the app's
settings and its registered :class:`~celery_lease.LeasedTask` tasks:

- always task leases and the commands of ``celery lease`` (inspection, ``doctor``);
- ``min_replicas`` when a task (or the app) sets ``lease_min_replicas``; ``preempt`` (its
  commands and the channels ``&<prefix>:preempt:*``) when a task's ``lease_on_conflict`` is
  ``"preempt"``; ``database`` and
  ``cluster`` from the URL and ``lease_backend_options``;
- ``hold`` and ``beat``: a worker cannot tell whether its tasks take a hold, nor whether it
  runs beat (``-B``), so a denial there warns at start instead of refusing.

Used by ``celery lease acl`` (:func:`rules`), the worker's start check and ``celery lease
doctor`` (:func:`problems`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import LeaseConfigError
from ..settings.config import LeaseOptions, resolve_backend
from ..store import permissions
from ..store.url import parse_store, safe_url
from .inspection import app_options, leased_tasks

__all__ = [
    "COMMAND_LINE",
    "MAYBE_USED",
    "StoreNeeds",
    "beat_configured",
    "needs",
    "problems",
    "rules",
]

#: Features a worker may or may not use: a denial warns at start, never refuses it.
MAYBE_USED = ("hold", "beat")
#: Features a worker never sends itself (``celery lease``), in every rule but not probed.
COMMAND_LINE = ("cli", "doctor")


@dataclass
class StoreNeeds:
    """What one lease store (a URL with its options) must let the ACL user do.

    Attributes:
        url: the store URL (credentials included: print it through ``safe_url``).
        options: its ``lease_backend_options``.
        timeout: the shortest ``lease_store_timeout`` of the tasks on it, float seconds.
        prefixes: the ``lease_key_prefix`` values its keys are under.
        features: the :data:`~celery_lease.store.permissions.FEATURES` it serves.
        extra_patterns: key patterns besides ``<prefix>:*`` (a ``lease_beat_key`` outside
            every prefix).
    """

    url: str
    options: Mapping[str, Any]
    timeout: float
    prefixes: set[str] = field(default_factory=set)
    features: set[str] = field(default_factory=lambda: {"tasks", *MAYBE_USED, *COMMAND_LINE})
    extra_patterns: set[str] = field(default_factory=set)

    @property
    def patterns(self) -> list[str]:
        """The key patterns of the rule: ``<prefix>:*`` per prefix, then the extra ones."""
        return [f"{p}:*" for p in sorted(self.prefixes)] + sorted(self.extra_patterns)

    @property
    def acl_user(self) -> str | None:
        """The ACL user the URL names, ``None`` when it names none (the default user)."""
        name = parse_store(self.url, self.options).params.get("username")
        return str(name) if name else None

    @property
    def user(self) -> str:
        """:attr:`acl_user`, else ``lease`` (the name the rules suggest)."""
        return self.acl_user or "lease"


def beat_configured(app: Any) -> bool:
    """True when ``app`` is set up for :class:`~celery_lease.beat.scheduler.LeasedScheduler`."""
    scheduler = str(app.conf.get("beat_scheduler") or "")
    return "LeasedScheduler" in scheduler or any(
        app.conf.get(name) is not None for name in ("lease_beat_ttl", "lease_beat_key")
    )


def needs(app: Any, tasks_only: bool = False) -> list[StoreNeeds]:
    """What each lease store of ``app`` must allow: its tasks' stores (each once per URL and
    options), else the app-wide one; and beat's.

    Args:
        tasks_only: only the stores of leased tasks (a worker's): beat's store counts only
            when a task uses it too, and no task means no store.

    Raises:
        LeaseConfigError: a task's settings are invalid, or no store is configured at all.
    """
    found: dict[tuple[str, str], StoreNeeds] = {}
    for task in leased_tasks(app):
        options, url, _ = task.lease_settings()
        need = _add(found, options, url)
        if need is not None and task._lease_limit_spec() not in (None, 1):
            need.features.add("limit")
    if not found and not tasks_only:
        options = app_options(app)
        _add(found, options, resolve_backend(options, app.conf, "app settings"))
    if beat_configured(app):
        _add_beat(app, found, tasks_only)
    for need in found.values():
        _add_url_features(need)
    return list(found.values())


def _add(
    found: dict[tuple[str, str], StoreNeeds], options: LeaseOptions, url: str, new: bool = True
) -> StoreNeeds | None:
    """Count a user of the store at ``url`` (with ``options.backend_options``) in ``found``:
    its key prefix, its features, and its ``store_timeout`` (float seconds) if the shortest.

    Args:
        found: the stores so far, by URL and options (mutated).
        new: False to count it only in a store already found (None is returned otherwise).
    """
    key = (url, repr(sorted(options.backend_options.items())))
    if not new and key not in found:
        return None
    need = found.setdefault(key, StoreNeeds(url, options.backend_options, options.store_timeout))
    need.timeout = min(need.timeout, options.store_timeout)
    need.prefixes.add(options.key_prefix)
    need.features |= _option_features(options)
    return need


def _option_features(options: LeaseOptions) -> set[str]:
    """The features a user of ``options`` needs besides task leases (``limit`` is a task's
    own option: :func:`needs` adds it)."""
    used = {
        "min_replicas": options.min_replicas > 0,
        "dedupe": options.dedupe,
        "debounce": options.debounce is not None,
        "handoff": options.hands_over,
        "preempt": options.on_conflict == "preempt",
    }
    return {feature for feature, wanted in used.items() if wanted}


def _add_beat(app: Any, found: dict[tuple[str, str], StoreNeeds], tasks_only: bool) -> None:
    """Count the beat leader lease in ``found`` (with ``tasks_only``, only in a store a task
    uses too), and its key as an extra pattern when no prefix of that store covers it.

    Invalid beat settings are left out: the doctor's beat check names them, and the tasks'
    rule stays printable.
    """
    from ..beat.scheduler import beat_lease_key  # beat is only imported by those who use it
    from ..settings.config import beat_settings

    try:
        beat = beat_settings(app.conf)
        need, key = _add(found, beat.options, beat.url, not tasks_only), beat_lease_key(app)
        if need is not None and not any(key.startswith(f"{p}:") for p in need.prefixes):
            need.extra_patterns.add(f"{key}*")
    except LeaseConfigError:
        pass


def _add_url_features(need: StoreNeeds) -> None:
    """Add the features the store's URL and options call for: ``cluster``, and ``database``
    for a database other than 0 (SELECT)."""
    spec = parse_store(need.url, need.options)
    if spec.kind == "cluster":
        need.features.add("cluster")
    if int(spec.params.get("db") or 0):
        need.features.add("database")


def rules(app: Any, user: str | None = None, password: str = "<password>") -> list[str]:
    """One ``redis-cli ACL SETUSER`` command per lease store of ``app``, each opening with a
    ``#`` line naming the store and the features (``user``: default the URL's, else
    ``lease``; ``password``: what the command sets, a placeholder by default).

    Raises:
        LeaseConfigError: as :func:`needs`.
    """
    out = []
    for need in needs(app):
        names = [f for f in permissions.FEATURES if f in need.features]
        out.append(
            f"# lease store {safe_url(need.url)}: {', '.join(names)}\n"
            + permissions.setuser(
                user or need.user,
                password,
                names,
                need.patterns,
                permissions.channels(names, need.prefixes),
            )
        )
    return out


def _text(found: permissions.Denied, user: str) -> str:
    feature = permissions.FEATURES[found.feature]
    if not found.commands:
        prefix = found.key.removesuffix(":" + permissions.PROBE_KEY)
        return (
            f"the ACL user may not use the key {found.key}: its key patterns do not cover "
            f"lease_key_prefix {prefix!r}; grant '~{prefix}:*' (ACL SETUSER {user} "
            f"'~{prefix}:*')"
        )
    granted = " ".join(f"+{c}" for c in found.commands)
    prefix = found.key.removesuffix(":" + permissions.PROBE_KEY)
    # A channel command may be refused for its channel: the fix grants the pattern too.
    channels = "".join(f" '&{c}'" for c in permissions.channels([feature.name], [prefix]))
    return (
        f"the ACL user may not run {granted} on {found.key}, which {feature.name} "
        f"({feature.title}) sends; grant it (ACL SETUSER {user} {granted}{channels})"
    )


def problems(
    client: Any, need: StoreNeeds, skip: tuple[str, ...] = ()
) -> tuple[list[str], list[str]] | None:
    """What the store's user lacks of ``need`` (but the features in ``skip``), asked of the
    server without running anything (:func:`celery_lease.store.permissions.denied`):
    ``(refusals, warnings)``, each a message naming the missing permissions and the fix.
    Refusals are for what every worker sends, warnings for :data:`MAYBE_USED` and
    :data:`COMMAND_LINE`. ``None`` when the server cannot be asked (Redis before 7.0).

    Raises:
        redis.exceptions.RedisError: store errors other than a refusal.
    """
    found = permissions.denied(client, need.features - set(skip), need.prefixes)
    if found is None:
        return None
    tail = (
        "; or grant the whole rule `celery lease acl` prints for this app "
        "(docs/deploying.md, section ACL)"
    )
    refusals: list[str] = []
    warnings: list[str] = []
    for item in found:
        maybe = item.feature in (*MAYBE_USED, *COMMAND_LINE)
        (warnings if maybe else refusals).append(_text(item, need.user) + tail)
    return refusals, warnings
