"""Benchmarks of celery-lease against its peers and the physical limit: ``python -m benchmarks``.

Five measurements, made side by side in one run so that the figures hold on a noisy machine
(ratios taken per round, medians, min-max):

1. :mod:`benchmarks.cycle` — acquire + release latency next to two ``PING`` round trips,
   redis-py ``Lock``, python-redis-lock and pottery ``Redlock``;
2. :mod:`benchmarks.overhead` — trivial-task throughput through a real worker, plain ``Task``
   vs ``LeasedTask`` vs celery-singleton vs celery-once;
3. :mod:`benchmarks.renewal` — round trips, CPU, threads and memory of keeping N leases alive,
   next to python-redis-lock's thread-per-lock auto-renewal;
4. :mod:`benchmarks.detection` — time for ``LeaseLost`` to reach a task body, per pool;
5. :mod:`benchmarks.stall` — time from SIGKILL of the holder to the next execution.

Everything talks to private redis-servers on free loopback ports. See ``docs/benchmarks.md``.
"""
