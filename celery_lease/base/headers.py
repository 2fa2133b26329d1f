"""The message headers the lease writes, one home for their names.

A header is how a publish tells the execution of its message something the execution's
settings cannot: that the message is a holder's successor, a redelivery's check copy, a
hand-over's run, a claimed waiting copy, or a burst's timer. Every name starts with
``lease_``; a copy of a message sent on by a policy drops them all but its own.
"""

from __future__ import annotations

__all__ = [
    "CLAIM_HEADER",
    "DEBOUNCE_HEADER",
    "HANDOFF_HEADER",
    "REDELIVERY_HEADER",
    "SUCCESSOR_HEADER",
]

#: The token of the execution that published this message while it held the same key (a
#: retry or a self-requeue): the message runs after that holder ends.
SUCCESSOR_HEADER = "lease_successor_of"

#: A copy republished by a delivery that found its own task id holding the lease; its value is
#: the holder's token. The copy runs only if that holder did not release (it died), which the
#: release notes beside the fencing counter.
REDELIVERY_HEADER = "lease_redelivery"

#: A run published by a hand-over (``coalesce``, ``queue``, ``retry``, a debounce burst); its
#: value is the lease key.
HANDOFF_HEADER = "lease_handoff"

#: A message that claimed its key's waiting slot at publish (``lease_dedupe``); its value is
#: the lease key. The execution's acquire clears the claim (``lease/acquire-4.lua``), and a
#: worker that drops the message as revoked or expired removes it.
CLAIM_HEADER = "lease_claimed"

#: A burst's timer message (``lease_debounce``); its value is the lease key.
DEBOUNCE_HEADER = "lease_debounce"
