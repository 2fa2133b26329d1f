"""A private virtual host on the shared RabbitMQ (localhost:5672) for the tests.

The server is shared: the tests only add a vhost of their own (``rabbitmqctl add_vhost`` and
``set_permissions`` for ``guest``), use it as the Celery broker, and delete it afterwards. They
never stop, restart or reconfigure the server. Without a server answering on 5672 the tests
skip, unless ``CELERY_LEASE_NEEDS_RABBITMQ=1`` (set by ``.ci/run``, which installs and starts
``rabbitmq-server`` when it is missing) makes them fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

HOST = "127.0.0.1"
PORT = 5672
NEEDS_ENV = "CELERY_LEASE_NEEDS_RABBITMQ"
#: Float seconds one ``rabbitmqctl`` call may take (it boots an Erlang node; slow on 2 cores).
CTL_TIMEOUT = 60.0


def answers(host: str = HOST, port: int = PORT, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require() -> str:
    """The path of ``rabbitmqctl`` when a RabbitMQ answers on 5672; else skip the test (or
    fail it, under ``CELERY_LEASE_NEEDS_RABBITMQ=1``)."""
    ctl = shutil.which("rabbitmqctl") or shutil.which("rabbitmqctl", path="/usr/sbin:/sbin")
    missing = (
        "rabbitmqctl is not installed"
        if ctl is None
        else None
        if answers()
        else f"no RabbitMQ answers on {HOST}:{PORT}"
    )
    if missing is None and ctl is not None:
        return ctl
    if os.environ.get(NEEDS_ENV) == "1":
        pytest.fail(f"{missing} (.ci/run installs and starts Debian's rabbitmq-server)")
    pytest.skip(f"{missing}: the RabbitMQ broker tests need a local rabbitmq-server")


def _ctl(ctl: str, *args: str) -> None:
    subprocess.run(
        [ctl, "-q", *args], check=True, capture_output=True, text=True, timeout=CTL_TIMEOUT
    )


@contextmanager
def private_vhost() -> Iterator[str]:
    """A new vhost ``guest`` may use, deleted (with its queues) on exit; yields the broker URL
    ``amqp://guest:guest@127.0.0.1:5672/<vhost>``."""
    ctl = require()
    vhost = f"celery-lease-test-{uuid.uuid4().hex[:10]}"
    _ctl(ctl, "add_vhost", vhost)
    try:
        _ctl(ctl, "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@{HOST}:{PORT}/{vhost}"
    finally:
        _ctl(ctl, "delete_vhost", vhost)
