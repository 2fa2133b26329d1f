"""The packer of celery_lease.store.wire: hiredis's C packer and the Python one write the same
bytes, and a real server reads them back as sent."""

from __future__ import annotations

import pytest

from celery_lease import store
from celery_lease.ops.testing import LeaseRedis
from celery_lease.store import wire

# What the hot path sends: command names, SHA1s, keys (a task name may be non-ASCII), tokens,
# holder JSON, int milliseconds (and the negative and large ones a script never gets).
ARGS = (
    "EVALSHA",
    "a" * 40,
    2,
    "lease:{tâche:0123abcd}",
    b"raw\x00\xffbytes",
    "f" * 32,
    30000,
    -1,
    2**63,
    "",
    '{"v":1,"task":"t","id":"x","host":"h","pid":7}',
)


def test_the_c_packer_writes_the_bytes_the_python_packer_writes() -> None:
    if wire._pack_hiredis is None:
        pytest.skip("hiredis is not installed: only the Python packer is used")
    assert wire._pack_hiredis(ARGS) == wire._pack_python(ARGS)
    assert wire._pack_hiredis(("PING",)) == wire._pack_python(("PING",)) == b"*1\r\n$4\r\nPING\r\n"


def test_a_packed_command_reads_back_as_sent(lease_redis: LeaseRedis) -> None:
    client = store.client_for(lease_redis.url, 2.0)
    values = [a if isinstance(a, bytes) else str(a).encode() for a in ARGS]
    assert wire.call(client, "RPUSH", "wire:args", *ARGS) == len(ARGS)
    assert lease_redis.client.lrange("wire:args", 0, -1) == values
