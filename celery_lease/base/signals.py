"""Celery-style signals sent by :mod:`celery_lease`.

Connect like any Celery signal: ``@lease_lost.connect def on_lost(sender, **kw): ...``.
``sender`` is the task (or, for :data:`lease_lost` and :data:`lease_renewal_failed`, which are
sent from the heartbeat thread, the task name as a str). Receivers of heartbeat-thread signals
must return quickly: they run on the thread that renews every lease of the process.

Common keyword arguments: ``key`` (str), ``token`` (str), ``fencing_token`` (int),
``task_id`` (str). Durations are float seconds.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "lease_acquired",
    "lease_coalesced",
    "lease_conflict",
    "lease_deduplicated",
    "lease_handed_over",
    "lease_lost",
    "lease_preempted",
    "lease_published",
    "lease_queued",
    "lease_released",
    "lease_renewal_failed",
    "lease_renewed",
]

#: A lease was granted before the task body ran. Extra: ``ttl`` (float seconds), ``latency``
#: (float seconds of the acquire round trip).
lease_acquired = Signal(name="lease_acquired")

#: Another execution holds the key. Extra: ``holder_task_id`` (str), ``holder`` ("node:pid":
#: the worker node name, or the host name outside a worker), ``remaining`` (float seconds),
#: ``policy`` ("skip", "retry", "fail", "coalesce", "queue", "redelivered", "successor",
#: "handed_over" (a second copy of a handed-over run that already ran to its release), or
#: "standby": a beat that found another beat leading; sent once per leader, with
#: ``sender="celery.beat"`` and ``task_id`` the standby beat's node name).
lease_conflict = Signal(name="lease_conflict")

#: A duplicate was coalesced into its key's pending run (``lease_on_conflict="coalesce"``),
#: sent after :data:`lease_conflict`. Extra: ``into`` (str: the pending run's task id),
#: ``joined`` (bool: True when a pending run existed, whose arguments this one replaced),
#: ``holder_task_id`` (str).
lease_coalesced = Signal(name="lease_coalesced")

#: A duplicate was parked in its key's line (``lease_on_conflict="queue"``), sent after
#: :data:`lease_conflict`. Extra: ``position`` (int: 1 for the head of the line),
#: ``holder_task_id`` (str).
lease_queued = Signal(name="lease_queued")

#: A run waiting for a key was published once the key was handed to it (by a release, or by
#: the crash sweep). ``sender`` is the task name (str). Extra: ``by`` (``"release"`` or
#: ``"sweep"``). ``task_id`` is the handed run's.
lease_handed_over = Signal(name="lease_handed_over")

#: A renewal was confirmed by the store (sent from the heartbeat thread, once per lease per
#: renewal). Extra: ``latency`` (float seconds of the round trip), ``margin`` (float seconds
#: that were left to the local deadline when the confirmation arrived). For metrics; no log.
lease_renewed = Signal(name="lease_renewed")

#: A renewal round trip failed without proving the lease lost (timeout, connection error).
#: Extra: ``error`` (the exception), ``time_left`` (float seconds to the local deadline).
lease_renewal_failed = Signal(name="lease_renewal_failed")

#: The lease was lost while the task ran. Extra: ``cause`` (str, see ``LostCause``), ``late``
#: (float seconds), ``error`` (the ``LeaseLost`` raised in the task). Also sent, with cause
#: ``refused``, when the release finds the key no longer the execution's and no loss had been
#: seen (then after the body ended, possibly from the thread that reads the release's reply).
lease_lost = Signal(name="lease_lost")

#: The execution ended and its lease was released. Extra: ``held`` (float seconds),
#: ``released`` (bool: False when the store no longer had this token; None when not known: the
#: store could not be reached, or the release was written and its reply is read later, as
#: ``LeasedTask`` does on a standalone Redis).
lease_released = Signal(name="lease_released")

#: A newer execution took the key over (``lease_on_conflict="preempt"``), sent by the newcomer
#: once it holds the key. ``token``/``fencing_token``/``task_id`` are the newcomer's; extra:
#: ``preempted_token``, ``preempted_task_id``, ``preempted_fencing_token``, ``preempted_holder``
#: ("node:pid"), ``notified`` (int: processes that got the notification; 0: the old holder
#: learns it at its next renewal).
lease_preempted = Signal(name="lease_preempted")

#: A publish of a task with ``lease_dedupe`` or ``lease_debounce`` was decided (sent in the
#: publishing process, once per ``apply_async``). Extra: ``disposition`` (``"published"``,
#: ``"deduplicated"``, ``"debounced"``: a publish of a burst, or ``"unguarded"``: the store
#: could not be asked or holds what celery-lease did not write, and the message was published
#: without a claim or debounce), ``task_id`` (str: the id the returned result names, the
#: waiting copy's when deduplicated, the burst's when debounced), ``key`` (str; ``""`` when
#: the arguments give no key, the message then published to fail at execution). For metrics.
lease_published = Signal(name="lease_published")

#: A publish of a task with ``lease_dedupe`` published nothing: a copy of the same key was
#: waiting (published, not started), and the caller got its result. Sent in the publishing
#: process, after :data:`lease_published`. Extra: ``task_id`` (str: the waiting copy's),
#: ``requested_task_id`` (str or None: the ``task_id`` the caller asked for, never used),
#: ``age`` (float seconds since the waiting copy was claimed, on the store's clock).
lease_deduplicated = Signal(name="lease_deduplicated")
