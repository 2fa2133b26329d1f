"""The Redis side of celery-lease: everything that talks to the lease store lives here.

Nothing above this package builds a Redis command; it calls these functions:

- the protocol (:mod:`.protocol`, :mod:`.renewal`): acquire, renew, release, revoke, the
  release that wakes a waiting hold and the wake-up a cancelled waiter passes on, each one
  script in ``scripts/<policy>/*.lua`` (:mod:`.lua`); the release into a cooldown
  (:mod:`.cooldown`);
- what is stored (:mod:`.value`: a lease's value; :mod:`.records`: reading leases back for
  ``celery lease ls``, and beat's last-run record);
- the slots of a limited key, up to N holders at once (:mod:`.slots`, ``lease_limit``);
- the claim of a task's waiting copy, decided at publish (:mod:`.claims`, ``lease_dedupe``);
- the client (:mod:`.connection`, :mod:`.url`), its topologies (:mod:`.topology`) and where
  each command goes on them (:mod:`.routing`), the raw connection path of a standalone client
  (:mod:`.wire`), releases whose replies are read later (:mod:`.pending`), acquires written
  as a worker's pool accepts the request and read when the execution starts
  (:mod:`.written`), whether a write
  landed on the primary the sentinels name (:mod:`.primary`), and the ``redis.asyncio``
  client a waiting ``hold_async`` blocks on (:mod:`.async_wait`);
- handing a key over to the next run (``coalesce``, ``queue``: :mod:`.handoff`): parking a
  duplicate, the release that reserves the key for the next run, the crash sweep's look;
- store errors (:mod:`.errors`), and whether the store answers, logged once per outage
  (:mod:`.health`);
- the commands each feature sends, and whether the ACL user may send them
  (:mod:`.permissions`).
"""

from __future__ import annotations

from . import handoff
from .claims import Claim, Decision, claim, confirm_claim, parse_claim, unclaim
from .connection import client_for, reset_clients
from .cooldown import release_into_cooldown
from .errors import NotReplicated, PrimaryUnconfirmed, describe, permanent_error
from .preempt import (
    next_message,
    preempt_channel,
    publish_preempted,
    subscribe,
    take_over,
    wait_preempted_end,
    wake_preempter,
    was_preempted,
)
from .protocol import (
    FENCE_COUNTER_EXTRA_MS,
    RAN_HOLDER,
    RESERVED_HOLDER,
    TOKEN_LENGTH,
    WAKE_LIFETIME_MS,
    AcquireResult,
    acquire,
    pass_turn,
    release,
    release_and_wake,
    released_last,
    revoke,
    wait_for_release,
)
from .renewal import RENEW_BATCH, renew_many
from .shape import PLAIN, KeyShape, key_shape
from .slots import (
    Slot,
    SlotsFull,
    acquire_slot,
    read_slots,
    release_slot,
    release_slot_and_wake,
    revoke_slot,
)
from .value import Holder, holder_json, new_token, parse_counter, parse_value

__all__ = [
    "FENCE_COUNTER_EXTRA_MS",
    "PLAIN",
    "RAN_HOLDER",
    "RENEW_BATCH",
    "RESERVED_HOLDER",
    "TOKEN_LENGTH",
    "WAKE_LIFETIME_MS",
    "AcquireResult",
    "Claim",
    "Decision",
    "Holder",
    "KeyShape",
    "NotReplicated",
    "PrimaryUnconfirmed",
    "Slot",
    "SlotsFull",
    "acquire",
    "acquire_slot",
    "claim",
    "client_for",
    "confirm_claim",
    "describe",
    "handoff",
    "holder_json",
    "key_shape",
    "new_token",
    "next_message",
    "parse_claim",
    "parse_counter",
    "parse_value",
    "pass_turn",
    "permanent_error",
    "preempt_channel",
    "publish_preempted",
    "read_slots",
    "release",
    "release_and_wake",
    "release_into_cooldown",
    "release_slot",
    "release_slot_and_wake",
    "released_last",
    "renew_many",
    "reset_clients",
    "revoke",
    "revoke_slot",
    "subscribe",
    "take_over",
    "unclaim",
    "wait_for_release",
    "wait_preempted_end",
    "wake_preempter",
    "was_preempted",
]
