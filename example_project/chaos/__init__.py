"""A fault campaign: many workers and keys, random faults for minutes, every effect checked.

``python -m example_project chaos --help``. The pieces, one idea each:

- :mod:`.infra`: the process helpers (Redis servers, a TCP proxy, Celery workers);
- :mod:`.history`: the recorded history, plain data;
- :mod:`.db`: the PostgreSQL database of one run: the fenced table and the history tables;
- :mod:`.worker_app`: the app and the leased job the workers (and beats) run, which records
  its history;
- :mod:`.sentinel`: the lease store of ``--sentinel`` (primary, replica, three sentinels) and
  its failovers;
- :mod:`.nemesis`: the seeded fault injector and the supervisor that restarts killed workers
  and beats;
- :mod:`.campaign`: the orchestration (servers, workers, producer, drain, final probes);
- :mod:`.checker`: pure functions that read a recorded history and list every broken promise;
- :mod:`.run`: the command line and the printed summary.
"""
