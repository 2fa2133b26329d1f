"""An acquire written ahead of its reply (celery_lease.store.written), as a worker's pool writes
it when it accepts a request, and read by the execution that takes the lease. Real Redis."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from celery_lease import store
from celery_lease.base import clock
from celery_lease.core import lifecycle
from celery_lease.core.lease import Lease
from celery_lease.settings.config import resolve_settings
from celery_lease.store import written
from tests.support.store_calls import NoTarget

HOLDER = lifecycle.HolderInfo("t", "task-1", "h")


@pytest.fixture
def app(lifecycle_app: Celery) -> Celery:
    return lifecycle_app


def _take(app: Celery, key: str, w: written.WrittenAcquire | None) -> Lease | store.AcquireResult:
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    asked = lifecycle.AcquireRequest(written=w)
    return lifecycle.take(settings, client, key, HOLDER, NoTarget(), sender="t", request=asked)


def _write(app: Celery, key: str) -> written.WrittenAcquire:
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    w = written.write(client, key, settings.options.ttl_ms, HOLDER.to_json(), HOLDER.task_id)
    assert w is not None
    return w


def test_take_reads_the_written_acquire_and_the_lease_is_its_token_and_send_time(
    app: Celery,
    redis_url: str,
) -> None:
    w = _write(app, "lease:{w:1}")
    got = _take(app, "lease:{w:1}", w)
    assert isinstance(got, Lease)
    assert (got.token, got.acquired_at) == (w.token, w.sent_at)
    raw = redis.Redis.from_url(redis_url).get("lease:{w:1}")
    assert raw is not None and raw.decode().split(":")[:2] == [w.token, str(got.fencing_token)]
    lifecycle.end(got, sender="t")
    assert redis.Redis.from_url(redis_url).exists("lease:{w:1}") == 0


def test_a_written_acquire_that_finds_the_key_held_is_a_conflict_naming_the_holder(
    app: Celery,
) -> None:
    first = _take(app, "lease:{w:2}", None)
    assert isinstance(first, Lease)
    got = _take(app, "lease:{w:2}", _write(app, "lease:{w:2}"))
    assert isinstance(got, store.AcquireResult) and not got.granted
    assert got.holder.token == first.token
    lifecycle.end(first, sender="t")


def test_a_written_acquire_the_server_has_no_script_for_is_sent_again_with_its_source(
    app: Celery,
    redis_url: str,
) -> None:
    redis.Redis.from_url(redis_url).script_flush()
    w = _write(app, "lease:{w:3}")  # answered NOSCRIPT: the script did not run
    got = _take(app, "lease:{w:3}", w)
    assert isinstance(got, Lease) and got.token == w.token
    lifecycle.end(got, sender="t")


def test_a_written_acquire_whose_reply_was_lost_is_asked_again_with_its_token(
    app: Celery,
    redis_url: str,
) -> None:
    w = _write(app, "lease:{w:4}")
    admin = redis.Redis.from_url(redis_url)
    # The script ran; the connection dies before the reply is read.
    deadline = clock.now() + 5.0
    while admin.exists("lease:{w:4}") == 0 and clock.now() < deadline:
        pass
    admin.client_kill_filter(_type="normal", skipme=True)
    got = _take(app, "lease:{w:4}", w)
    assert isinstance(got, Lease) and got.token == w.token  # its own grant, not a conflict
    assert got.acquired_at == w.sent_at
    lifecycle.end(got, sender="t")
    assert admin.exists("lease:{w:4}") == 0


def test_an_abandoned_written_acquire_releases_its_grant_and_never_another_holders(
    app: Celery,
    redis_url: str,
) -> None:
    admin = redis.Redis.from_url(redis_url)
    _write(app, "lease:{w:5}").abandon()
    assert admin.exists("lease:{w:5}") == 0
    holder = _take(app, "lease:{w:5}", None)
    assert isinstance(holder, Lease)
    _write(app, "lease:{w:5}").abandon()  # refused: the holder keeps the key
    raw = admin.get("lease:{w:5}")
    assert raw is not None and raw.decode().startswith(holder.token + ":")
    lifecycle.end(holder, sender="t")


def test_a_kept_acquire_goes_to_its_task_id_once_and_a_late_or_stale_one_is_abandoned(
    app: Celery,
    redis_url: str,
) -> None:
    admin = redis.Redis.from_url(redis_url)
    late = _write(app, "lease:{w:5b}")
    assert written.keep("id-5", late, stale_at=clock.now() + 60)
    assert written.take("id-5", max_age=-1.0) is None  # taken too late to start on: abandoned
    assert admin.exists("lease:{w:5b}") == 0
    w = _write(app, "lease:{w:6}")
    assert written.keep("id-6", w, stale_at=clock.now() + 60)
    second = _write(app, "lease:{w:6b}")
    assert not written.keep("id-6", second, stale_at=clock.now() + 60)  # one per task id
    second.abandon()
    assert written.take("id-7") is None
    assert written.take("id-6") is w and written.take("id-6") is None
    w.abandon()
    stale = _write(app, "lease:{w:8}")
    assert written.keep("id-8", stale, stale_at=clock.now() - 1)
    written.abandon_stale(clock.now())
    assert written.take("id-8") is None
    assert admin.exists("lease:{w:8}") == 0 and admin.exists("lease:{w:6b}") == 0
