"""The PostgreSQL side of a campaign: one fresh database per run, the fenced table, the history.

The fenced table is the downstream effect the lease protects. Its guard is one conditional
upsert (``... ON CONFLICT DO UPDATE ... WHERE excluded.fence >= fenced.fence``), and the
attempt is recorded in the same statement, so the history cannot disagree with the guard. The
row lock the upsert takes orders the attempts on one key; the history's ``id`` follows it.
Fencing tokens are microseconds since the epoch or more (about 1.8e15): ``BIGINT``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from .history import Execution, Job, Parked, Preemption, Write

__all__ = [
    "DEFAULT_ADMIN_DSN",
    "Recorder",
    "create_database",
    "drop_database",
    "load",
    "load_preemptions",
    "unfinished",
]

#: Where the run's database is created (``CHAOS_PG_DSN`` overrides): the machine's server.
DEFAULT_ADMIN_DSN = "host=localhost port=5432 user=postgres dbname=postgres"

T = TypeVar("T")

SCHEMA = """
CREATE TABLE fenced (key TEXT PRIMARY KEY, fence BIGINT NOT NULL, value TEXT,
                     writes INTEGER NOT NULL DEFAULT 1);
CREATE TABLE writes (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, job TEXT NOT NULL,
                     token TEXT NOT NULL, fence BIGINT NOT NULL, worker TEXT, pid INTEGER,
                     accepted BOOLEAN NOT NULL, started_at DOUBLE PRECISION,
                     done_at DOUBLE PRECISION);
CREATE TABLE executions (token TEXT PRIMARY KEY, key TEXT NOT NULL, job TEXT NOT NULL,
                         task_id TEXT, fence BIGINT NOT NULL, worker TEXT, pid INTEGER,
                         grant_lower DOUBLE PRECISION, grant_upper DOUBLE PRECISION,
                         body_end DOUBLE PRECISION, outcome TEXT, lost_cause TEXT,
                         lost_at DOUBLE PRECISION, confirmed_lower DOUBLE PRECISION,
                         released BOOLEAN);
CREATE TABLE jobs (job TEXT PRIMARY KEY, key TEXT NOT NULL, path TEXT NOT NULL,
                   task_id TEXT NOT NULL, submitted_at DOUBLE PRECISION NOT NULL,
                   parent TEXT, disposition TEXT, folded_onto TEXT,
                   decided_lower DOUBLE PRECISION, decided_upper DOUBLE PRECISION);
CREATE TABLE parked (id BIGSERIAL PRIMARY KEY, task_id TEXT NOT NULL, key TEXT NOT NULL,
                     kind TEXT NOT NULL, covering TEXT NOT NULL,
                     park_lower DOUBLE PRECISION, park_upper DOUBLE PRECISION);
CREATE TABLE preemptions (token TEXT PRIMARY KEY, preempted TEXT NOT NULL, key TEXT NOT NULL,
                          at DOUBLE PRECISION NOT NULL, notified INTEGER NOT NULL);
"""

# One statement: the guard, and the attempt recorded with the guard's answer.
FENCED_WRITE = """
WITH up AS (
  INSERT INTO fenced AS f (key, fence, value) VALUES (%(key)s, %(fence)s, %(value)s)
  ON CONFLICT (key) DO UPDATE SET fence = EXCLUDED.fence, value = EXCLUDED.value,
                                  writes = f.writes + 1
  WHERE EXCLUDED.fence >= f.fence
  RETURNING 1)
INSERT INTO writes (key, job, token, fence, worker, pid, accepted, started_at, done_at)
VALUES (%(key)s, %(job)s, %(token)s, %(fence)s, %(worker)s, %(pid)s,
        EXISTS (SELECT 1 FROM up), %(started)s, %(started)s)
RETURNING id, accepted
"""


def admin_dsn() -> str:
    """The DSN of the maintenance database (``CHAOS_PG_DSN`` or :data:`DEFAULT_ADMIN_DSN`)."""
    return os.environ.get("CHAOS_PG_DSN") or DEFAULT_ADMIN_DSN


def create_database(prefix: str = "chaos") -> str:
    """Create a fresh database with the campaign's tables; returns its DSN.

    Raises:
        psycopg.OperationalError: the server at :func:`admin_dsn` cannot be reached (start
            PostgreSQL or set ``CHAOS_PG_DSN``).
    """
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(admin_dsn(), dbname=name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return dsn


def drop_database(dsn: str) -> None:
    """Drop the database of ``dsn`` (closing whatever sessions are left in it)."""
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name)))
        )


class Recorder:
    """The history writer of one process: a small pool of autocommit connections.

    Any thread or greenlet may call it. A connection that fails (or that an asynchronous
    ``LeaseLost`` interrupted mid-statement) is dropped and the call is tried once more on a
    fresh one, so the body's records survive the faults it is there to observe.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._idle: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's sockets are not ours
                self._idle, self._pid = [], os.getpid()
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self._idle.append(conn)

    def _run(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        try:
            with self._connection() as conn:
                return work(conn)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            with self._connection() as conn:
                return work(conn)

    def fenced_write(self, key: str, job: str, token: str, fence: int, worker: str) -> bool:
        """Write ``key`` guarded by ``fence`` and record the attempt; True when accepted."""
        params = {
            "key": key,
            "fence": fence,
            "value": f"{job}:{token}",
            "job": job,
            "token": token,
            "worker": worker,
            "pid": os.getpid(),
            "started": time.time(),
        }

        def work(conn: psycopg.Connection[Any]) -> bool:
            row = conn.execute(FENCED_WRITE, params).fetchone()
            assert row is not None
            conn.execute("UPDATE writes SET done_at = %s WHERE id = %s", (time.time(), row[0]))
            return bool(row[1])

        return self._run(work)

    def execution_started(self, run: Execution) -> None:
        """Record an execution whose lease was just granted."""
        self._run(
            lambda conn: conn.execute(
                "INSERT INTO executions (token, key, job, task_id, fence, worker, pid, grant_lower,"
                " grant_upper) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    run.token,
                    run.key,
                    run.job,
                    run.task_id,
                    run.fence,
                    run.worker,
                    run.pid,
                    run.grant_lower,
                    run.grant_upper,
                ),
            )
        )

    def execution_ended(
        self,
        token: str,
        outcome: str,
        body_end: float | None,
        cause: str | None = None,
        lost_at: float | None = None,
        confirmed: float | None = None,
    ) -> None:
        """Record how the body ended (``ok``, ``lost``, ``retry``) and the last time the
        store was known to still hold its lease (``confirmed``)."""
        self._run(
            lambda conn: conn.execute(
                "UPDATE executions SET outcome = %s, body_end = %s, lost_cause = %s, lost_at = %s,"
                " confirmed_lower = %s WHERE token = %s",
                (outcome, body_end, cause, lost_at, confirmed, token),
            )
        )

    def execution_released(self, token: str, released: bool | None) -> None:
        """Record the library's word at release (False: the store no longer had the token;
        None: the reply is read later, so the library said nothing)."""
        self._run(
            lambda conn: conn.execute(
                "UPDATE executions SET released = %s WHERE token = %s", (released, token)
            )
        )

    def job_submitted(self, job: Job, parent: str | None = None) -> None:
        """Record a submitted job (before it is sent, so no execution precedes its record)."""
        self._run(
            lambda conn: conn.execute(
                "INSERT INTO jobs (job, key, path, task_id, submitted_at, parent)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (job.job, job.key, job.path, job.task_id, job.submitted_at, parent),
            )
        )

    def job_published(
        self, job: str, disposition: str, task_id: str, lower: float, upper: float
    ) -> None:
        """Record what the publish of a ``lease_dedupe`` (or ``lease_debounce``) job decided,
        in ``[lower, upper]``: its disposition and the task id its result names (the burst's,
        for every publish of a burst)."""
        self._run(
            lambda conn: conn.execute(
                "UPDATE jobs SET disposition = %s, folded_onto = %s, decided_lower = %s,"
                " decided_upper = %s WHERE job = %s",
                (
                    disposition,
                    task_id if disposition in ("deduplicated", "debounced") else None,
                    lower,
                    upper,
                    job,
                ),
            )
        )

    def job_unsent(self, job: str) -> None:
        """Forget a job whose send raised: its sender was told, so it promised nothing."""
        self._run(lambda conn: conn.execute("DELETE FROM jobs WHERE job = %s", (job,)))

    def duplicate_parked(self, parked: Parked) -> None:
        """Record a duplicate a worker parked in its key's line."""
        self._run(
            lambda conn: conn.execute(
                "INSERT INTO parked (task_id, key, kind, covering, park_lower, park_upper)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (parked.task_id, parked.key, parked.kind, parked.into, parked.lower, parked.upper),
            )
        )

    def preempted(self, taken: Preemption) -> None:
        """Record a take-over (``lease_on_conflict="preempt"``)."""
        self._run(
            lambda conn: conn.execute(
                "INSERT INTO preemptions (token, preempted, key, at, notified)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (token) DO NOTHING",
                (taken.token, taken.preempted, taken.key, taken.at, taken.notified),
            )
        )

    def close(self) -> None:
        """Close the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def unfinished(dsn: str) -> list[str]:
    """Task ids of the jobs that no execution has completed yet (skipped or failed included;
    a folded ``lease_dedupe`` job by the task id of the copy it was folded onto)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            row[0]
            for row in conn.execute(
                "SELECT COALESCE(folded_onto, task_id) FROM jobs j WHERE NOT EXISTS (SELECT 1"
                " FROM executions e WHERE e.job = j.job AND e.outcome = 'ok')"
            )
        ]


def load(dsn: str) -> tuple[list[Write], list[Execution], list[Job], list[Parked]]:
    """Read the writes, executions, jobs and parked duplicates recorded in ``dsn``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        writes = [
            Write(*row)
            for row in conn.execute(
                "SELECT id, key, job, token, fence, worker, pid, accepted, started_at, done_at"
                " FROM writes ORDER BY id"
            )
        ]
        runs = [
            Execution(*row)
            for row in conn.execute(
                "SELECT token, key, job, task_id, fence, worker, pid, grant_lower, grant_upper,"
                " body_end, outcome, lost_cause, lost_at, confirmed_lower, released"
                " FROM executions"
            )
        ]
        jobs = [
            Job(
                row[0],
                row[1],
                row[2],
                row[3],
                row[4],
                disposition=row[5],
                folded_onto=row[6],
                decided_lower=row[7],
                decided_upper=row[8],
            )
            for row in conn.execute(
                "SELECT job, key, path, task_id, submitted_at, disposition, folded_onto,"
                " decided_lower, decided_upper FROM jobs ORDER BY submitted_at"
            )
        ]
        parked = [
            Parked(*row)
            for row in conn.execute(
                "SELECT task_id, key, kind, covering, park_lower, park_upper FROM parked"
                " ORDER BY id"
            )
        ]
    return writes, runs, jobs, parked


def load_preemptions(dsn: str) -> list[Preemption]:
    """Read the take-overs recorded in ``dsn``, in the order they were recorded."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            Preemption(*row)
            for row in conn.execute(
                "SELECT token, preempted, key, at, notified FROM preemptions ORDER BY at"
            )
        ]
