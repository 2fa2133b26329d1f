"""The plain lease with RabbitMQ as the broker, on prefork and threads workers.

Celery's broker is a private vhost on the shared RabbitMQ (:mod:`tests.support.rabbitmq`); the
results, the leases and the journal the tasks write stay in Redis. The tests are the
Redis-broker ones, imported: pytest collects them here too, and the fixtures they ask for
(``pool_rig``, ``rig``) are this module's rigs. Duplicates are skipped while one runs, a
SIGKILLed holder's job runs again once its TTL is over, a holder stopped past its TTL learns
``LeaseLost`` when it is continued, and an ``acks_late`` + ``reject_on_worker_lost`` message
whose worker was killed is delivered again by RabbitMQ and runs once more, once.
The shaping policies on RabbitMQ are in each policy's own test module
(``@pytest.mark.parametrize("broker_url", BROKERS, indirect=True)``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.redis_server import RedisServer
from tests.support.rig import Rig
from tests.test_faults import (
    test_killed_holder_lease_gone_within_one_ttl,
    test_other_producers_refused_while_the_holder_runs,
    test_paused_past_lifetime_successor_runs_old_holder_learns_first,
)

# Last: on threads it kills one of the rig's two workers for good.
from tests.test_lifecycle import test_redelivery_after_the_holder_died_runs_once_its_lease_lapsed

__all__ = [
    "test_killed_holder_lease_gone_within_one_ttl",
    "test_other_producers_refused_while_the_holder_runs",
    "test_paused_past_lifetime_successor_runs_old_holder_learns_first",
    "test_redelivery_after_the_holder_died_runs_once_its_lease_lapsed",
]


@pytest.fixture(scope="module", params=["prefork", "threads"])
def rabbit_rig(
    request: pytest.FixtureRequest,
    broker: RedisServer,
    rabbitmq_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Rig]:
    """A rig whose workers consume from RabbitMQ; a threads worker is one process, so its rig
    runs two: the second takes what RabbitMQ gives back when the first is killed."""
    pool = request.param
    rig = Rig(broker, pool, tmp_path_factory.mktemp(pool), broker_url=rabbitmq_url)
    for _ in range(1 if pool == "prefork" else 2):
        rig.worker()
    yield rig
    rig.close()


@pytest.fixture
def pool_rig(rabbit_rig: Rig) -> Rig:
    """The module's rig, its journal and lease store emptied."""
    rabbit_rig.reset()
    return rabbit_rig


@pytest.fixture
def rig(pool_rig: Rig) -> Rig:
    """The name tests/test_lifecycle.py asks for."""
    return pool_rig
