"""The test suite's infrastructure: pytest fixtures (``fixtures``) and the fault rig (``rig``).

Redis servers, TCP proxies, Celery workers and polling live in the repository's ``harness``
package, shared with the benchmarks and the demo; the modules ``redis_server``, ``proxy``,
``workers`` and ``waiting`` here re-export them under their historical paths.
"""
