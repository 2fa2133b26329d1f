"""The lease itself: taking and ending it, renewing it, and delivering its loss.

:mod:`.lifecycle` takes and ends a lease (the one place, for tasks, holds and beat),
:mod:`.lease` is the held lease, :mod:`.heartbeat` renews every lease of the process, and
:mod:`.interrupt` (with :mod:`.next_instruction`) raises ``LeaseLost`` where the holder runs.
The core imports no policy.
"""
