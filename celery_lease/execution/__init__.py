"""A leased execution and its publish: :class:`~.task.LeasedTask`, its request
(:mod:`.accepted`), its ``apply_async`` (:mod:`.publishing`), eager mode (:mod:`.eager`),
``lease_tasks`` (:mod:`.lease_tasks`) and what it does while the store is out (:mod:`.outage`).
"""
