"""A ``lease_backend`` listing stale sentinels, on real processes: the primary check counts the
group the live sentinels know, grants while a majority of it answers, refuses while it does
not, and the doctor, the worker's start check and a refused task name the sentinels that do
not answer.

The stale list: one sentinel of the group (the group is three sentinels that monitor the
primary, quorum 2), one sentinel that hangs (SIGSTOP: it accepts connections and answers
nothing) and a port nobody listens on.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import Celery

from celery_lease import LeasedTask, LeaseStoreUnavailable, store
from celery_lease.store import sentinels
from harness.redis_server import HOST, free_port
from harness.topologies import MASTER_NAME, Node, SentinelSetup
from tests.support.holders import Holders
from tests.support.store_calls import spy
from tests.support.waiting import wait_for
from tests.test_cli import celery_lease

OPTIONS = {"master_name": MASTER_NAME}
HOLDER = store.holder_json("t.job", "task-1", "host", 42)


@dataclass
class Stale:
    """The set-up, and a URL listing one of its sentinels, a hung one and a dead port."""

    setup: SentinelSetup
    hung: Node
    dead: int

    @property
    def url(self) -> str:
        listed = [self.setup.sentinels[0].port, self.hung.port, self.dead]
        return ";".join(f"sentinel://{HOST}:{port}" for port in listed) + "/0"

    @property
    def silent(self) -> tuple[str, str]:
        """The two listed sentinels that do not answer."""
        return self.hung.address, f"{HOST}:{self.dead}"


@pytest.fixture
def stale() -> Iterator[Stale]:
    with SentinelSetup() as setup:
        setup.start()
        hung = setup.stray_sentinel()
        hung.pause()
        yield Stale(setup, hung, free_port())


def holders(url: str, **conf: Any) -> Holders:
    """Holders on ``url``; another ``lease_store_timeout`` gives them a client of their own
    (another worker's, which never looked at the group)."""
    defaults = {"lease_ttl": 4.0, "lease_renew_interval": 0.5, "lease_store_timeout": 0.4}
    return Holders(lease_backend=url, lease_backend_options=OPTIONS, **{**defaults, **conf})


def grant(client: Any) -> bool:
    return bool(store.acquire(client, f"lease:{{{uuid.uuid4().hex}}}", "a" * 32, 30_000, HOLDER))


def test_a_stale_sentinel_list_grants_while_the_group_has_a_majority(stale: Stale) -> None:
    with holders(stale.url) as h:
        outcome = h.start(1)
        assert outcome.error is None, outcome.error
        run = h.running(1)
        assert run is not None
        since = time.monotonic()
        # Renewals are confirmed by the group as well.
        wait_for(
            lambda: h.renewals_of(run.key, since) >= 2,
            10,
            message=lambda: f"no renewal confirmed; errors: {h.errors[-3:]}",
        )
        assert run.lost is None
    client = store.client_for(stale.url, 1.0, OPTIONS)
    assert grant(client)  # the first confirmation of a client looks at the group
    took = []
    for _ in range(5):
        started = time.monotonic()
        assert grant(client)
        took.append(time.monotonic() - started)
    # The hung sentinel is not asked again: a grant does not wait for it (half the store
    # timeout, 0.5 s, to connect).
    assert statistics.median(took) < 0.25, took


def test_a_grant_on_a_healthy_group_asks_each_sentinel_once(
    stale: Stale, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = store.client_for(stale.setup.sentinel_url, 1.0, OPTIONS)
    assert grant(client)  # the group is looked at once, here
    asked = spy(monkeypatch, sentinels, "ask")
    for _ in range(10):
        assert grant(client)
    # One round per grant, to the three sentinels, for the primary's address alone: the
    # group's next look is not due for sentinels.LIFETIME seconds.
    assert len(asked) == 10
    assert {(len(clients), tuple(map(tuple, commands))) for clients, commands, _ in asked} == {
        (3, (("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME),))
    }


def test_a_minority_of_the_group_refuses_every_grant_until_a_majority_answers(
    stale: Stale,
) -> None:
    _, second, third = stale.setup.sentinels
    with holders(stale.url) as h:
        assert h.start(1).error is None  # the group was looked at: three live sentinels
        second.pause()
        third.kill()
        for n in (2, 3):  # the first asks the two that stopped, the second leaves them out
            outcome = h.start(n)
            assert outcome.done.wait(10)
            error = outcome.error
            assert isinstance(error, LeaseStoreUnavailable), error
            assert "only 1 of the 3 sentinels of the group answered" in str(error), error
            assert second.address in str(error) and third.address in str(error), error
            assert not any(r.n == n for r in h.runs)
    # A client that never saw the group answer (another worker) is refused as well: the live
    # sentinel names the two others, which do not answer.
    with holders(stale.url, lease_store_timeout=0.45) as fresh:
        outcome = fresh.start(4)
        assert outcome.done.wait(10)
        assert "only 1 of the 3 sentinels of the group answered" in str(outcome.error)
        assert fresh.runs == []
        second.resume()  # a majority again: grants resume, found by a look in the background
        wait_for(
            lambda: fresh.start(5).error is None and fresh.running(5) is not None,
            20,
            interval=0.5,
            message="no grant once a majority of the group answered again",
        )


def test_a_refused_grant_is_logged_once_naming_the_sentinels_that_do_not_answer(
    stale: Stale, caplog: pytest.LogCaptureFixture
) -> None:
    _, second, third = stale.setup.sentinels
    with holders(stale.url) as h:
        assert h.start(1).error is None
        second.pause()
        third.pause()
        with caplog.at_level("DEBUG", logger="celery_lease"):
            for n in (2, 3, 4):
                outcome = h.start(n)
                assert outcome.done.wait(10) and outcome.error is not None
    refusals = [r for r in caplog.records if "not run" in r.getMessage()]
    assert len(refusals) == 3
    # The held lease's failing renewals are reported apart (lease_renewal_failed).
    reported = [r for r in refusals if r.levelname != "DEBUG"]
    assert len(reported) == 1, [r.getMessage() for r in reported]
    assert reported[0].levelname == "WARNING"
    line = reported[0].getMessage()
    assert "only 1 of the 3 sentinels of the group answered" in line, line
    assert second.address in line and third.address in line, line
    assert "celery lease doctor" in line


def _app(url: str) -> Celery:
    app = Celery("stale_sentinels", broker="memory://", set_as_current=False)
    app.conf.update(lease_backend=url, lease_backend_options=OPTIONS)

    @app.task(base=LeasedTask, name="stale_sentinels.job", shared=False)  # type: ignore[misc]
    def job() -> None:
        pass

    return app


def test_doctor_and_the_worker_start_check_name_the_sentinels_that_do_not_answer(
    stale: Stale, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    from celery_lease.ops.doctor import check_sentinels
    from celery_lease.ops.worker import check_app

    app = _app(stale.url)
    (finding,) = check_sentinels(stale.url, app)
    hung, dead = stale.silent
    assert finding.level == "warn", finding
    assert f"{hung} (timed out; no member of the group)" in finding.message, finding
    assert f"{dead} (connection refused; no member of the group)" in finding.message, finding
    assert "leases can be granted: 3 of the 3 sentinels of the group answer" in finding.message
    members = ", ".join(n.address for n in sorted(stale.setup.sentinels, key=lambda n: n.port))
    assert f"list the group's sentinels in lease_backend ({members})" in finding.fix
    with caplog.at_level("WARNING", logger="celery_lease"):
        check_app(app)
    started = [
        r.getMessage() for r in caplog.records if "sentinels not answering" in r.getMessage()
    ]
    assert len(started) == 1 and hung in started[0] and dead in started[0], started
    assert "leases can be granted" in started[0]

    _, second, third = stale.setup.sentinels
    second.pause()
    third.pause()
    env = {"LEASE_BACKEND": stale.url, "LEASE_BACKEND_OPTIONS": json.dumps(OPTIONS)}
    done = celery_lease(env, "doctor", timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if "leases cannot be granted" in line]
    assert len(failed) == 1 and failed[0].startswith("FAIL store sentinel://"), done.stdout
    assert all(a in failed[0] for a in (second.address, third.address, hung, dead)), failed
    assert "1 of the 3 sentinels of the group answer" in failed[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="celery_lease"):
        check_app(app)
    refused = [r for r in caplog.records if "leases cannot be granted" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelname == "ERROR", refused
    assert second.address in refused[0].getMessage() and third.address in refused[0].getMessage()


def test_a_sentinel_reset_during_a_partition_does_not_shrink_the_group_a_client_knows(
    stale: Stale,
) -> None:
    first, second, third = stale.setup.sentinels
    client = store.client_for(stale.url, 1.0, OPTIONS)
    assert grant(client)  # the client looked at the group: three sentinels
    second.pause()
    third.pause()
    with first.client() as admin:  # the one live sentinel now names no other
        admin.execute_command("SENTINEL", "RESET", MASTER_NAME)
        assert admin.execute_command("SENTINEL", "SENTINELS", MASTER_NAME) == []
    group = sentinels.look_for(client)
    assert group is not None
    # One answer of the three members known before is no majority of them: it cannot tell
    # that the group shrank, and the two silent members still count.
    assert len(group.members) == 3 and group.answering == ((HOST, first.port),)
    assert not group.grantable
    with pytest.raises(store.PrimaryUnconfirmed, match="only 1 of the 3 sentinels"):
        grant(client)
