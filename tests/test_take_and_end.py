"""Taking and ending a lease (celery_lease.core.lifecycle), the path tasks and beat both use.

Real Redis. Where a reply must be lost after the script ran, the real acquire runs and only
its reply is replaced by a connection error; the deadline clock is a hand-moved fake.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from celery_lease import store
from celery_lease.base import clock, signals
from celery_lease.beat.scheduler import BeatLeader
from celery_lease.core import lifecycle
from celery_lease.core.heartbeat import heartbeat
from celery_lease.core.lease import Lease
from celery_lease.settings.config import beat_settings, resolve_settings
from tests.support.received import received
from tests.support.store_calls import NoTarget, lose_first_reply


class FakeClock:
    """The deadline clock, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(clock, "now", fake)
    return fake


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    app = Celery("lifecycle", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=redis_url, lease_ttl=6.0, lease_beat_ttl=6.0)
    yield app
    for lease in heartbeat().held():  # nothing of a test outlives it
        heartbeat().remove(lease)


def test_take_counts_the_deadline_from_the_first_send_when_its_reply_was_lost(
    app: Celery,
    fake_clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    first_send = fake_clock.t
    calls = lose_first_reply(
        monkeypatch, "acquire", lambda: setattr(fake_clock, "t", fake_clock.t + 2.0)
    )
    got = lifecycle.take(
        settings,
        client,
        "lease:{t:1}",
        lifecycle.HolderInfo("t", "id", "h"),
        NoTarget(),
        sender="t",
    )
    assert isinstance(got, Lease) and len(calls) == 2
    assert got.acquired_at == first_send
    assert got.deadline == first_send + 6.0 - settings.options.drift_margin
    lifecycle.end(got, sender="t")


def test_beat_counts_its_deadline_from_the_first_send_when_its_reply_was_lost(
    app: Celery,
    fake_clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options, url, _ = beat_settings(app.conf)
    leader = BeatLeader(app, "lease:{celery.beat:lifecycle}", options, url)
    first_send = fake_clock.t
    lose_first_reply(monkeypatch, "acquire", lambda: setattr(fake_clock, "t", fake_clock.t + 2.0))
    leading, _ = leader.poll()
    assert leading and leader.lease is not None
    # The key was created on the server at the first send: the local deadline must fall
    # before it can expire there.
    assert leader.lease.deadline == first_send + options.ttl - options.drift_margin
    pttl_ms = redis.Redis.from_url(url).pttl(leader.key)
    assert pttl_ms <= options.ttl_ms
    leader.step_down()


def test_conflict_returns_the_holder_and_finishes_the_target(app: Celery) -> None:
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    first = lifecycle.take(
        settings, client, "lease:{t:2}", lifecycle.HolderInfo("t", "a", "h"), NoTarget(), sender="t"
    )
    assert isinstance(first, Lease)
    target = NoTarget()
    second = lifecycle.take(
        settings, client, "lease:{t:2}", lifecycle.HolderInfo("t", "b", "h"), target, sender="t"
    )
    assert isinstance(second, store.AcquireResult) and not second.granted
    assert second.holder.task_id == "a" and second.holder.fencing_token == first.fencing_token
    assert target.finished
    ending = lifecycle.end(first, sender="t")
    assert ending.released and ending.loss is None
    assert client.exists("lease:{t:2}") == 0


def test_end_records_a_deadline_that_passed_unnoticed_as_a_loss(
    app: Celery,
    fake_clock: FakeClock,
) -> None:
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    with received(signals.lease_released) as seen:
        lease = lifecycle.take(
            settings,
            client,
            "lease:{t:3}",
            lifecycle.HolderInfo("t", "c", "h"),
            NoTarget(),
            sender="t",
        )
        assert isinstance(lease, Lease)
        fake_clock.t += 7.0  # past the deadline, whether or not the heartbeat noticed yet
        ending = lifecycle.end(lease, sender="t")
    assert ending.loss is not None and ending.loss.cause == "deadline"
    assert ending.held == pytest.approx(7.0)
    assert [s["key"] for s in seen] == ["lease:{t:3}"]
    assert lease.retired and lease not in heartbeat().held()


@pytest.mark.parametrize("wait", [True, False], ids=["release waited for", "reply read later"])
def test_a_release_that_finds_the_key_gone_reports_the_loss(app: Celery, wait: bool) -> None:
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    with received(signals.lease_lost) as lost:
        lease = lifecycle.take(
            settings,
            client,
            "lease:{t:4}",
            lifecycle.HolderInfo("t", "d", "h"),
            NoTarget(),
            sender="t",
        )
        assert isinstance(lease, Lease)
        redis.Redis.from_url(settings.url).delete("lease:{t:4}")  # gone before any renewal
        ending = lifecycle.end(lease, sender="t", wait=wait)
        if not wait:
            assert ending.released is None and ending.loss is None and lost == []
            # The reply is read before this process's next acquire.
            other = lifecycle.take(
                settings,
                client,
                "lease:{t:5}",
                lifecycle.HolderInfo("t", "e", "h"),
                NoTarget(),
                sender="t",
            )
            assert isinstance(other, Lease)
            lifecycle.end(other, sender="t")
    assert [(x["key"], x["cause"]) for x in lost] == [("lease:{t:4}", "refused")]
    assert lost[0]["fencing_token"] == lease.fencing_token
    if wait:
        assert ending.released is False and ending.loss is not None
        assert ending.loss.cause == "refused"


def test_the_ending_end_returns_is_the_one_its_class_builds(app: Celery) -> None:
    # end() builds its Ending without the frozen dataclass's __init__: the same object.
    settings = resolve_settings(app.conf, {}, "test")
    client = store.client_for(settings.url, settings.options.store_timeout)
    lease = lifecycle.take(
        settings,
        client,
        "lease:{t:ending}",
        lifecycle.HolderInfo("t", "f", "h"),
        NoTarget(),
        sender="t",
    )
    assert isinstance(lease, Lease)
    ending = lifecycle.end(lease, sender="t")
    assert ending == lifecycle.Ending(None, True, ending.held)
    assert repr(ending) == repr(lifecycle.Ending(None, True, ending.held))
    with pytest.raises(AttributeError):
        ending.held = 0.0  # type: ignore[misc]  # still frozen
