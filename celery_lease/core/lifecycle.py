"""Taking and ending a lease: the one place where a lease is taken, for tasks, beat and more.

:class:`~celery_lease.execution.task.LeasedTask` and
:class:`~celery_lease.beat.scheduler.BeatLeader` both go through here; so should anything else that
holds a lease (a lease around any block of code, an asynchronous release), so that the guarantees
below hold everywhere.

API (durations are float seconds, times are :func:`celery_lease.base.clock.now` seconds)::

    holder = HolderInfo(task_name, task_id, hostname)        # who is asking, for the store
    claim = Claim()                                          # claim.lease: set at the grant
    got = take(settings, client, key, holder, target, sender=..., claim=claim)
    if isinstance(got, Lease): ...                           # granted, renewed from now on
    else: ...                                                # an AcquireResult: held elsewhere
    ending = end(lease, sender=...)                          # Ending(loss, released, held)
    ending = end(lease, sender=..., wait=False)              # released=None: reply read later

    # or in two halves, for a caller that sends the release itself (e.g. pipelined):
    loss = retire(lease)                                     # no more renewals
    ...                                                      # store.release(...) however
    ending = announce_end(lease, loss, released, sender=...)

:func:`take`:

1. sends the acquire with a fresh token; on an ambiguous failure (connection error or timeout:
   the script may have run and only the reply been lost) asks once more with the same token,
   which the script recognises as its own, so a lost reply leaves no phantom lease;
2. counts the local deadline from the *first* send: if the first reply was lost after the
   script ran, the lifetime on the server started then;
3. registers the lease with the process's heartbeat and sends
   :data:`~celery_lease.base.signals.lease_acquired`.

On a conflict it returns the :class:`~celery_lease.store.AcquireResult` (holder, time left)
and does not retry; on a store error it finishes ``target``, releases what the failed attempt
may have been granted (best effort; nothing when no send reached the store, e.g. a refused
connection) and raises the :class:`redis.exceptions.RedisError`. Whether the store answered
is reported to the process's :mod:`celery_lease.store.health` state, which logs an outage
once as it begins and once as it ends.

Exits: any exception, ``BaseException`` included (a soft or hard time limit, ``SystemExit``,
``KeyboardInterrupt``, gevent's ``Timeout``), at any point of :func:`take` or :func:`end`
leaves no lease held by nobody: the lease is unregistered from the heartbeat and its token
released (token-checked, best effort; the token is made before the acquire is sent, so its
release is safe to send whether or not the grant's reply arrived), then the exception is
re-raised. A caller closes the gap between :func:`take` returning and its own ``finally``
with a :class:`Claim`, filled at the grant.

:func:`take` first reads the replies of every release this process wrote without waiting
(:mod:`celery_lease.store.pending`): an acquire is never sent before them.

:func:`end` (= :func:`retire`, a token-checked release, :func:`announce_end`):

1. records a local deadline that passed unnoticed (a starved heartbeat) as a loss;
2. unregisters the lease from the heartbeat (returns once no renewal of it is on the wire), so
   nothing renews it after its release;
3. releases it, only while its token holds the key, and never from a forked child; a release
   whose connection broke (a restarted or failed-over server) is sent once more, so that the
   holder still learns whether the store had its token to the end;
4. sends :data:`~celery_lease.base.signals.lease_released`.

With ``wait=False`` step 3 only writes the release (a standalone client; Cluster and Sentinel
clients release synchronously): :func:`end` returns once the command is handed to the socket,
with ``released=None``; its reply is read later (:mod:`celery_lease.store.pending`).

Policies (skip, retry, standby...) and the caller's own logs and events stay with the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import store
from ..base import clock, process, signals
from ..errors import LeaseLost
from ..settings.config import LeaseOptions, LeaseSettings
from ..store import health, pending
from ..store.written import WrittenAcquire
from .heartbeat import heartbeat
from .interrupt import Target
from .lease import Lease

__all__ = [
    "AcquireRequest",
    "Claim",
    "Ending",
    "HolderInfo",
    "announce_end",
    "end",
    "retire",
    "take",
]

logger = logging.getLogger("celery_lease")


@dataclass(frozen=True)
class HolderInfo:
    """Who holds a lease, as written into the stored value (``celery lease ls`` shows it).

    Attributes:
        task_name: the task name, or what stands for it (``celery.beat`` for beat).
        task_id: the task id, or what stands for it (the beat node name).
        hostname: the host the holder runs on.
    """

    task_name: str
    task_id: str
    hostname: str

    def to_json(self) -> str:
        """The stored holder description, with the calling process's pid."""
        return store.holder_json(self.task_name, self.task_id, self.hostname, process.pid())


@dataclass(frozen=True)
class Ending:
    """How a lease ended.

    Attributes:
        loss: the :class:`~celery_lease.errors.LeaseLost` if it was lost while held, else None.
        released: True when the release deleted the key (False: the store no longer had this
            token, could not be reached, or the release was not sent from this process); None
            when the release was written and its reply is read later (``end(wait=False)``).
        held: float seconds from the first send of the acquire to the end.
    """

    loss: LeaseLost | None
    released: bool | None
    held: float


@dataclass(slots=True)
class AcquireRequest:
    """What one :func:`take` asks the store for, beyond the key and the holder: filled by the
    caller and the policies of the execution before the acquire is sent.

    Attributes:
        shape: the key's shape (:data:`celery_lease.store.PLAIN`, or the slots of a
            ``lease_limit`` above 1: :func:`celery_lease.store.key_shape`); its ``acquire``
            grants, its ``release`` frees what an interrupted take got, its ``limit`` is the
            lease's.
        claimed: the execution's message claimed the key's waiting slot at publish
            (``lease_dedupe``): the grant clears that claim, in the same script.
        handed_over: the execution is a run a hand-over release published (its copy that
            already ran is refused: :func:`celery_lease.store.acquire`).
        written: the plain acquire of the key written as the pool accepted the request
            (:mod:`celery_lease.execution.accepted`): read, not sent; its token and send time
            are used.
        grant: a script that grants instead of ``shape.acquire``, called as it is (a take-over
            from a preempted holder: :func:`celery_lease.store.take_over`), or None.
    """

    shape: store.KeyShape = store.PLAIN
    claimed: bool = False
    handed_over: bool = False
    written: WrittenAcquire | None = None
    grant: Callable[..., store.AcquireResult] | None = None


class Claim:
    """Where :func:`take` puts the lease the moment the store granted it, before it registers
    it with the heartbeat: a caller that made the claim before calling :func:`take` finds the
    lease after any exit (a time limit, ``SystemExit``, ``KeyboardInterrupt``), also one that
    lands after :func:`take` returned and before the caller stored what it returned.

    Attributes:
        lease: the granted :class:`~celery_lease.core.lease.Lease`, or None (not granted, or
            already ended by :func:`take` itself after an exit interrupted it).
    """

    __slots__ = ("lease",)

    def __init__(self) -> None:
        self.lease: Lease | None = None


def take(
    settings: LeaseSettings,
    client: redis.Redis,
    key: str,
    holder: HolderInfo,
    target: Target,
    *,
    sender: Any,
    claim: Claim | None = None,
    request: AcquireRequest | None = None,
) -> Lease | store.AcquireResult:
    """Take lease ``key`` and start renewing it (see the module docstring for the steps).

    An exit of any kind (``BaseException`` included) after the acquire was sent leaves no lease
    held by nobody: the lease is unregistered, its token released (token-checked, best effort:
    the token is made here, so its release is safe to send whether or not the grant's reply
    arrived), ``target`` finished, ``claim.lease`` cleared, and the exit re-raised.

    Args:
        settings: the resolved settings (TTL, intervals, signal).
        client: the store's client (:func:`celery_lease.store.client_for`).
        key: the lease key.
        holder: who asks.
        target: where a loss is delivered; finished here when no lease results.
        sender: the ``sender`` of the signals sent.
        claim: set to the lease as soon as it is granted (see :class:`Claim`).
        request: what the acquire asks for (:class:`AcquireRequest`; None: a plain key, nothing
            claimed or handed over, nothing written ahead).

    Returns:
        The granted :class:`~celery_lease.core.lease.Lease`, or the
        :class:`~celery_lease.store.AcquireResult` describing the holder on a conflict.

    Raises:
        redis.exceptions.RedisError: the store failed (after the one same-token retry).
    """
    # No call before the `try`: an asynchronous exception lands only at a call (or a jump
    # back), so none can land outside it.
    sent = announced = False
    lease: Lease | None = None
    token = ""
    asked = _PLAIN_REQUEST if request is None else request
    try:
        options = settings.options
        shape, written = asked.shape, asked.written
        send = asked.grant or shape.acquire
        if written is None:  # else they were settled as it was written
            pending.settle_all()  # the replies of this process's earlier releases, first
        # The local deadline counts from the first send: if its reply was lost after the
        # script ran, the lifetime on the server started then, not at the second try.
        token, sent_at = (
            (store.new_token(), clock.now())
            if written is None
            else (written.token, written.sent_at)
        )
        sent = True  # from here on the store may grant the token, reply or not
        try:
            found = (
                written.read()
                if written is not None
                else send(
                    client,
                    key,
                    token,
                    options.ttl_ms,
                    holder.to_json(),
                    options.min_replicas,
                    holder.task_id,
                    asked.handed_over,
                    asked.claimed,
                )
            )
        except (RedisConnectionError, RedisTimeoutError):  # the same token, asked again
            found = _send(send, client, key, token, options, holder, asked)
        reachable = health.reachability(settings.url)
        reachable.answered()
        if not found.granted:
            target.finish()
            return found
        lease = Lease(
            key=key,
            token=token,
            fencing_token=found.holder.fencing_token,
            task_name=holder.task_name,
            task_id=holder.task_id,
            options=options,
            client=client,
            target=target,
            sent_at=sent_at,
            joined=found.joined,
            reachable=reachable,
        )
        if shape.limit > 1:
            lease.limit = shape.limit  # a slot of a limited key (lease_limit)
        if claim is not None:
            claim.lease = lease
        heartbeat(settings.signum).add(lease)
        logger.debug(
            "lease acquired: key=%s task=%s[%s] token=%s fencing_token=%d ttl=%.3fs",
            key,
            holder.task_name,
            holder.task_id,
            token,
            lease.fencing_token,
            options.ttl,
        )
        if signals.lease_acquired.receivers:  # what Signal.send checks first, before kwargs
            signals.lease_acquired.send(
                sender=sender,
                key=key,
                token=token,
                fencing_token=lease.fencing_token,
                task_id=holder.task_id,
                ttl=options.ttl,
                latency=clock.now() - sent_at,
            )
        announced = True
        return lease
    except BaseException as exc:
        if isinstance(exc, RedisError):
            health.reachability(settings.url).failed(exc, f"acquire of {key}")
        _undo_take(
            client,
            key,
            token,
            target,
            lease if sent else None,
            sent and not _unsent(exc),
            sender if announced else None,
            asked.shape.release,
        )
        if claim is not None:
            claim.lease = None
        raise


#: What a :func:`take` without a request asks for: a plain key, nothing else.
_PLAIN_REQUEST = AcquireRequest()


def _send(
    send: Callable[..., store.AcquireResult],
    client: redis.Redis,
    key: str,
    token: str,
    options: LeaseOptions,
    holder: HolderInfo,
    asked: AcquireRequest,
) -> store.AcquireResult:
    """The acquire sent again with the same token (``send`` is called as
    :func:`celery_lease.store.acquire`); the first send is inline in :func:`take`."""
    return send(
        client,
        key,
        token,
        options.ttl_ms,
        holder.to_json(),
        options.min_replicas,
        holder.task_id,
        asked.handed_over,
        asked.claimed,
    )


def _undo_take(
    client: redis.Redis,
    key: str,
    token: str,
    target: Target,
    lease: Lease | None,
    sent: bool,
    sender: Any,
    release: Callable[[redis.Redis, str, str], bool] = store.release,
) -> None:
    """After an exit interrupted :func:`take`: finish ``target``, unregister ``lease`` and
    release ``token`` if the acquire was ``sent`` (it may have been granted, its reply lost or
    never read). Best effort: a release that fails leaves the key to its TTL. A lease whose
    acquisition was announced (``sender`` not None) gets its release announced too."""
    try:
        target.finish()
    finally:
        if lease is not None:
            _release_after_exit(lease, release)
            if sender is not None:
                announce_end(lease, None, None, sender=sender)
        elif sent:
            _abandon(client, key, token, release)


def _unsent(error: BaseException) -> bool:
    """True when the acquire that raised ``error`` never reached the store, so that it
    granted nothing to release: every send of it failed before a byte was written (the
    same-token retry's error is chained to the first send's)."""
    if not health.never_reached(error):
        return False
    first = error.__context__
    return first is None or not health.is_unreachable(first) or health.never_reached(first)


def _abandon(
    client: redis.Redis,
    key: str,
    token: str,
    release: Callable[[redis.Redis, str, str], bool] = store.release,
) -> None:
    """Best effort: release a grant whose reply may have been lost (else it lapses)."""
    try:
        release(client, key, token)
    except Exception as exc:
        # An unreachable store is reported once per outage (store.health), not per call.
        logger.log(
            logging.DEBUG if health.is_unreachable(exc) else logging.WARNING,
            "the acquire of %s may have been granted (its reply was not read) and its "
            "release failed too: if granted, it lapses within its TTL: %s",
            key,
            store.describe(exc),
        )


def retire(lease: Lease) -> LeaseLost | None:
    """First half of :func:`end`: record a passed deadline as a loss, stop renewing.

    Returns the loss, if the lease was lost. The caller must then release the lease
    (token-checked, e.g. :func:`celery_lease.store.release`) and call :func:`announce_end`.
    """
    try:
        # Before it is unregistered: a retired lease records no loss.
        return lease.detect_loss()
    finally:  # whatever interrupts the above, nothing renews the lease any more
        heartbeat().remove(lease)  # unregistered before the release is sent


def announce_end(
    lease: Lease,
    loss: LeaseLost | None,
    released: bool | None,
    *,
    sender: Any,
    held: float | None = None,
) -> Ending:
    """Second half of :func:`end`: log and send :data:`~celery_lease.base.signals.lease_released`.

    Args:
        lease: the retired lease.
        loss: what :func:`retire` returned.
        released: whether the release deleted the key (None: written, reply read later).
        sender: the signal's ``sender``.
        held: float seconds the lease was held (default: until now).
    """
    if held is None:
        held = clock.now() - lease.acquired_at
    logger.debug(
        "lease released: key=%s task=%s[%s] token=%s fencing_token=%d held=%.3fs released=%s",
        lease.key,
        lease.task_name,
        lease.task_id,
        lease.token,
        lease.fencing_token,
        held,
        released,
    )
    if signals.lease_released.receivers:
        signals.lease_released.send(
            sender=sender,
            key=lease.key,
            token=lease.token,
            fencing_token=lease.fencing_token,
            task_id=lease.task_id,
            held=held,
            released=released,
        )
    ending: Ending = object.__new__(Ending)  # without the frozen __init__: once an execution
    ending.__dict__.update(loss=loss, released=released, held=held)
    return ending


def end(
    lease: Lease,
    *,
    sender: Any,
    wait: bool = True,
    release: Callable[[redis.Redis, str, str], bool] = store.release,
) -> Ending:
    """End ``lease``: record a missed deadline, stop renewing, release, announce.

    Never raises for a store error: a release that fails is logged and the key expires within
    one TTL on its own. An exit (any ``BaseException``: a time limit, ``SystemExit``...) that
    interrupts it before the release went out still unregisters the lease and sends the
    release once (best effort), then is re-raised; one that interrupts the release's wait for
    its reply sends it once more (token-checked: harmless if the first one ran). Only an end
    that never runs (a killed process) leaves the key to its TTL.

    Args:
        lease: a lease returned by :func:`take`.
        sender: the ``sender`` of :data:`~celery_lease.base.signals.lease_released`.
        wait: False to return once the release is written, without its reply (a standalone
            client and a lease not lost; otherwise it waits): ``released`` is then None, in
            the returned :class:`Ending` and in :data:`~celery_lease.base.signals.lease_released`.
        release: the token-checked release to send when waiting (a hold's also wakes one
            waiter: :func:`celery_lease.store.release_and_wake`); only :func:`store.release`
            can be written without waiting.
    """
    sent = False  # True once the release went out (or failed for a store error)
    try:  # no call before it: see take()
        loss = retire(lease)
        released: bool | None = None  # unknown until the store answers
        if lease.pid == process.pid():  # never in a forked child: the parent's lease is not ours
            try:
                # A lost lease is released synchronously: rare, and its signal says what
                # happened.
                if not wait and release is store.release and loss is None and _write(lease):
                    sent = True
                    heartbeat().wake_for_pending()
                    return announce_end(lease, loss, None, sender=sender)
                released = _send_release(lease, release)
            except RedisError as exc:
                _release_failed(lease, loss, exc)
            sent = True
            if released is False and loss is None:
                loss = lease.lost_at_release()
    except BaseException:
        if not sent:  # an exit before the release went out: it still goes out, once
            _release_after_exit(lease, release)
        raise
    return announce_end(lease, loss, released, sender=sender)


def _release_failed(lease: Lease, loss: LeaseLost | None, error: RedisError) -> None:
    """Log the failed release of ``lease`` (``loss``: its loss, if it was lost) for what it
    leaves behind. An unreachable store is reported to its reachability state (logged once
    per outage), the rest here."""
    reachable = lease.reachable
    unreachable = (
        reachable.failed(error, f"release of {lease.key}")
        if reachable is not None
        else health.is_unreachable(error)
    )
    if loss is None:  # the key is still this execution's, until its TTL runs out
        logger.warning(
            "lease release failed (it expires within %.3fs): key=%s error=%s",
            lease.ttl,
            lease.key,
            store.describe(error),
        )
        return
    # Lost first: at its deadline (drift margin included), the key had lapsed or was about
    # to; refused or preempted, it is gone or another's. The release had nothing to free.
    logger.log(
        logging.DEBUG if unreachable else logging.INFO,
        "lease release failed after the lease was lost (cause=%s): its key has lapsed or is "
        "another's, nothing to release: key=%s error=%s",
        loss.cause,
        lease.key,
        store.describe(error),
    )


def _release_after_exit(lease: Lease, release: Callable[[redis.Redis, str, str], bool]) -> None:
    """After an exit (any ``BaseException``) interrupted taking or ending ``lease``: make sure
    nothing renews it, then ``release`` it once (token-checked, so safe whether or not an
    earlier release went out). Best effort and never raises an ``Exception``: a release that
    fails leaves the key to its TTL, and the caller re-raises the exit."""
    try:
        lease.target.finish()
    finally:
        heartbeat().remove(lease)
        if lease.pid == process.pid():
            try:
                release(lease.client, lease.key, lease.token)
            except Exception as exc:
                logger.warning(
                    "lease release after an exit failed (it expires within %.3fs): key=%s error=%s",
                    lease.ttl,
                    lease.key,
                    store.describe(exc),
                )


def _write(lease: Lease) -> bool:
    """Write the release without waiting for its reply (:mod:`celery_lease.store.pending`); False
    when it must be sent waiting: not a standalone client, or the connection broke."""
    try:
        return (
            pending.write(
                lease.client,
                lease.key,
                lease.token,
                lease.ttl,
                lambda done: _note_reply(lease, done),
            )
            is not None
        )
    except RedisConnectionError:
        return False


def _send_release(lease: Lease, release: Callable[[redis.Redis, str, str], bool]) -> bool:
    """``release`` the lease, sent once more if the connection broke.

    A connection breaks when the server restarts or fails over, or a proxy closes it; the
    holder must still learn whether the store had its token up to the end (a later holder may
    have been granted the key meanwhile). The release is token-checked and answers True again
    for a token it already released, so sending it twice is safe, as taking is
    (:func:`take`). Not after a timeout: a store that did not answer in time is hung or far
    away, and a second wait would only delay the end of the execution.
    """
    try:
        return release(lease.client, lease.key, lease.token)
    except RedisConnectionError:
        return release(lease.client, lease.key, lease.token)


def _note_reply(lease: Lease, released: bool | None) -> None:
    """The reply of a release written by ``end(wait=False)`` (read by the next acquire or the
    heartbeat): a release that found the key no longer this execution's is a loss."""
    if released is False:
        lease.lost_at_release()
