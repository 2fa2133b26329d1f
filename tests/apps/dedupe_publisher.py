"""A publisher of ``dedupe.sync`` that SIGKILLs itself at one step of its publish
(``tests/test_dedupe_faults.py``): ``python -m tests.apps.dedupe_publisher <step> <tag>
<task id>`` with the worker's environment (``TEST_BROKER_URL``, ``TEST_QUEUE``).

Steps: ``claimed`` (Celery's ``before_task_publish``: the claim is written, nothing is on the
broker) and ``published`` (``after_task_publish``: the message is on the broker, its claim not
yet given its full lifetime).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from celery.signals import after_task_publish, before_task_publish

from tests.apps.dedupe_app import sync


def _die(**_: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(step: str, tag: str, task_id: str) -> None:
    """Publish ``sync(tag)`` under ``task_id``, killed at ``step``."""
    hook = {"claimed": before_task_publish, "published": after_task_publish}[step]
    hook.connect(_die, weak=False)
    sync.apply_async((tag,), task_id=task_id)
    raise SystemExit(f"the publish went past the {step} step alive")


if __name__ == "__main__":
    main(*sys.argv[1:4])
