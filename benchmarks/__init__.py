"""Benchmarks of celery-lease against its peers and the physical limit: ``python -m benchmarks``.

Seven measurements, made side by side in one run so that the figures hold on a noisy machine
(ratios taken per round, medians, min-max):

1. :mod:`benchmarks.cycle` — acquire + release latency next to two ``PING`` round trips,
   redis-py ``Lock``, python-redis-lock and pottery ``Redlock``;
2. :mod:`benchmarks.overhead` — trivial-task throughput through a real worker, plain ``Task``
   vs ``LeasedTask`` vs celery-singleton vs celery-once;
3. :mod:`benchmarks.renewal` — round trips, CPU, threads and memory of keeping N leases alive,
   next to python-redis-lock's thread-per-lock auto-renewal;
4. :mod:`benchmarks.detection` — time for ``LeaseLost`` to reach a task body, per pool;
5. :mod:`benchmarks.stall` — time from SIGKILL of the holder to the next execution;
6. :mod:`benchmarks.soak` — many leased executions through one worker: memory, sockets, threads;
7. :mod:`benchmarks.e2e` — the whole trip, publisher included: time and CPU of producer, worker
   and Redis, for distinct keys and duplicate-heavy bursts.

:mod:`benchmarks.instructions` (run on its own) counts instructions per execution under
callgrind, per library and per step of a leased execution.

Everything talks to private redis-servers on free loopback ports. See ``docs/benchmarks.md``.
"""
