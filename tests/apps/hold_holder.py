"""A process that holds ``celery_lease.hold`` (or ``hold_async``) until it loses the lease.

``python -m tests.apps.hold_holder URL NAME CONTEXT`` with CONTEXT one of ``main`` (the main
thread: the loss arrives as a signal), ``thread`` (another thread: an asynchronous exception),
``gevent`` (monkey-patched, a greenlet) or ``asyncio`` (``hold_async``: a cancelled task).
Prints ``HELD <fencing token>`` once inside, then ``LOST <cause> <fencing token>`` when
``LeaseLost`` reaches the block, or ``NOT LOST`` after 30 s; exits 0.
"""

from __future__ import annotations

import sys

CONTEXT = sys.argv[3]
if CONTEXT == "gevent":
    from gevent import monkey

    monkey.patch_all()

import asyncio  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from celery_lease import LeaseLost, hold, hold_async  # noqa: E402

URL, NAME = sys.argv[1], sys.argv[2]
TTL = 1.0


def say(text: str) -> None:
    print(text, flush=True)


def hold_until_lost() -> None:
    try:
        with hold(NAME, url=URL, ttl=TTL) as lease:
            say(f"HELD {lease.fencing_token}")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.02)  # short sleeps: an asynchronous exception lands between them
            say("NOT LOST")
    except LeaseLost as exc:
        say(f"LOST {exc.cause} {exc.fencing_token} {type(exc).__name__}")


async def hold_async_until_lost() -> None:
    try:
        async with hold_async(NAME, url=URL, ttl=TTL) as lease:
            say(f"HELD {lease.fencing_token}")
            await asyncio.sleep(30)
            say("NOT LOST")
    except LeaseLost as exc:
        say(f"LOST {exc.cause} {exc.fencing_token} {type(exc).__name__}")


if CONTEXT == "asyncio":
    asyncio.run(hold_async_until_lost())
elif CONTEXT == "thread":
    worker = threading.Thread(target=hold_until_lost)
    worker.start()
    worker.join()
else:
    hold_until_lost()
