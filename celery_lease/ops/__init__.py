"""Operating leases: the ``celery lease`` command (:mod:`.cli`), its doctor (:mod:`.doctor`),
looking at leases from outside (:mod:`.inspection`), Flower (:mod:`.flower`), Prometheus
(:mod:`.metrics`), the ACL an app needs (:mod:`.acl`), the worker's start check
(:mod:`.worker`), the hand-over sweep (:mod:`.sweep`) and the pytest plugin (:mod:`.testing`).
"""
