"""One campaign: servers, workers, producer and nemesis for a while, then drain, probe, record.

The broker (the machine's RabbitMQ, on a queue of the run's own) and the result backend (a
private Redis) are never faulted: the campaign tests the lease, not them. RabbitMQ because it
gives a dead consumer's unacknowledged messages back at once and loses none, while the Redis
transport can lose a message it popped for a worker killed at that moment (``--redis-url``
runs on Redis anyway). The lease store is another private Redis, reached by the workers
through a :class:`~example_project.chaos.infra.TcpProxy` so it can be black-holed and slowed.
The fenced writes and the history go to a fresh PostgreSQL database, dropped at the end.
With ``sentinel``, the lease store is a Sentinel set-up instead (one primary, one replica,
three sentinels; :mod:`.sentinel`), reached through the sentinels, without a proxy.

Two ``celery beat`` processes (``-S celery_lease.beat:LeasedScheduler``: one leader, one
standby) send the job for a few keys on a short period while the producer runs; the job's
app records each beat send before it is published (``worker_app._record_beat_send``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

from celery_lease import is_coalesced
from celery_lease.base.keys import is_internal
from celery_lease.ops.inspection import scan_claims

from . import db
from .checker import LEASE_ERRORS
from .history import History, Job, WorkerSample
from .infra import RedisServer, TcpProxy, wait_for
from .nemesis import FAULTS, SENTINEL_FAULTS, Fleet, Nemesis
from .sentinel import SentinelStore

__all__ = ["DEFAULT_AMQP_URL", "Settings", "run_campaign"]

#: The broker when ``--redis-url`` is not given: the machine's RabbitMQ.
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@dataclass
class Settings:
    """What one campaign does. Durations are float seconds.

    ``rate``: jobs submitted per second; ``duplicates``: share of submissions sent twice at
    once; ``beats``: beat processes (0: no beat); ``beat_keys``: how many keys (``k0``...)
    beat sends the job for, each every ``beat_period``; ``sentinel``: the lease store is a
    Sentinel set-up, and ``failover`` is a fault; ``drain``: how long to wait for the last
    jobs after the nemesis stops; ``cooldown``: the job's ``lease_cooldown`` (0: none);
    ``preempt_grace``: the preempt job's ``lease_preempt_grace`` (its keys ``p0``..``p4``);
    ``limit``: the ``lease_limit`` of a limited job sent on keys of its own (0: none);
    ``debounce_min_replicas``, ``dedupe_min_replicas``: the debounce and the dedupe job's
    ``lease_min_replicas`` (``--sentinel``);
    ``broker_url``: an existing Redis for the broker and results (default: RabbitMQ at
    ``CHAOS_AMQP_URL`` or :data:`DEFAULT_AMQP_URL`, results on a private Redis).
    """

    duration: float = 120.0
    workers: int = 3
    keys: int = 20
    seed: int = 1
    ttl: float = 3.0
    rate: float = 3.0
    duplicates: float = 0.15
    beats: int = 2
    beat_keys: int = 3
    beat_period: float = 3.0
    sentinel: bool = False
    drain: float = 60.0
    log_dir: str | None = None
    broker_url: str | None = None
    cooldown: float = 0.0
    preempt_grace: float = 0.5
    limit: int = 0
    debounce_min_replicas: int = 0
    dedupe_min_replicas: int = 0


#: Keys of the preempt job: few, so that its copies meet (each meeting is a take-over).
PREEMPT_KEYS = 5


def _pid_tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo += [int(p) for p in children.read_text().split()]
            except OSError:
                pass
    return pids


def _peers() -> dict[str, int]:
    """Socket inode -> remote TCP port, for every TCP socket on the machine."""
    found: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            found[fields[9]] = int(fields[2].rsplit(":", 1)[1], 16)
    return found


def _resources(pid: int, names: dict[int, str] | None = None) -> tuple[int, int, dict[str, int]]:
    """(RSS bytes, open sockets, sockets by peer name) of ``pid`` and its descendants."""
    rss = sockets = 0
    peers, by_peer = _peers(), Counter[str]()
    for member in _pid_tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
            for fd in Path(f"/proc/{member}/fd").iterdir():
                try:
                    link = os.readlink(fd)
                except OSError:
                    continue
                if link.startswith("socket:"):
                    sockets += 1
                    port = peers.get(link[8:-1], 0)
                    by_peer[(names or {}).get(port, "other" if port else "local")] += 1
        except OSError:
            continue
    return rss, sockets, dict(by_peer)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")


def _lease_keys(client: redis.Redis, prefix: str) -> list[str]:
    """The leases under ``prefix`` (the jobs' and the beat leader's), not the library's
    other keys (fencing counters, the beat's last-run record)."""
    keys = [_text(k) for k in client.scan_iter(match=f"{prefix}*", count=500)]
    return [k for k in keys if not is_internal(k)]


class _Sampler(threading.Thread):
    """Samples every worker's RSS and sockets every few seconds, per process.

    A worker killed by the nemesis comes back as a new process; comparing it with its
    predecessor would prove nothing, so each process is compared with its own first sample
    taken :data:`WARM_UP` seconds after it appeared, taken again while its process tree grows
    (a prefork child killed just before that sample comes back later: the tree's RSS and
    sockets are compared at the same number of processes).
    """

    def __init__(self, fleet: Fleet, peers: dict[int, str], every: float = 5.0) -> None:
        super().__init__(daemon=True, name="sampler")
        self.fleet, self.peers, self.every = fleet, peers, every
        self.halt = threading.Event()
        self.first_seen: dict[int, float] = {}
        self.baseline: dict[int, tuple[int, int, dict[str, int]]] = {}
        self.tree_sizes: dict[int, int] = {}  # processes in the tree at its baseline

    def sample(self) -> None:
        now = time.time()
        for slot in self.fleet.slots:
            pid = slot.worker.pid
            if slot.stopped or not slot.worker.is_running():
                continue
            seen = self.first_seen.setdefault(pid, now)
            size = len(_pid_tree(pid))
            if now - seen >= WARM_UP and size > self.tree_sizes.get(pid, 0):
                self.baseline[pid] = _resources(pid, self.peers)
                self.tree_sizes[pid] = size

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.sample()


#: Seconds a worker process runs before its first resource sample (imports, pools filling).
WARM_UP = 10.0


class _Producer(threading.Thread):
    """Submits jobs for random keys at a steady rate until told to stop."""

    def __init__(self, settings: Settings, rng: random.Random, submit: Any) -> None:
        super().__init__(daemon=True, name="producer")
        self.settings, self.rng, self.submit = settings, rng, submit
        self.halt = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        period = 1.0 / self.settings.rate
        next_at = time.monotonic()
        while not self.halt.is_set():
            key = f"k{self.rng.randrange(self.settings.keys)}"
            path = self.rng.choices(
                [
                    "delay",
                    "send_task",
                    "retry",
                    "requeue",
                    "dedupe",
                    "coalesce",
                    "queue",
                    "preempt",
                    "limited",
                    "debounce",
                ],
                weights=[4, 3, 2, 1, 3, 2, 2, 2, 4 if self.settings.limit else 0, 2],
            )[0]
            if path in ("coalesce", "queue", "limited"):  # their own keys: their own leases
                key = path[0] + key[1:]
            elif path == "preempt":
                key = f"p{int(key[1:]) % PREEMPT_KEYS}"
            try:
                # 2 to 8 writes 0.3 s apart: some jobs end before their first renewal (at
                # TTL/3), others renew once or more.
                writes = self.rng.randint(2, 8)
                if path == "debounce":  # publishes of one key spread in time, in a thread
                    self._debounce(f"b{key[1:]}", writes)
                elif path == "dedupe":  # a burst of publishes of one key, some retrying
                    mode = self.rng.choice(["plain", "plain", "retry", "requeue"])
                    # Keys of their own ("d3"): the fenced rows and the history are per key.
                    for _ in range(self.rng.randint(1, 3)):
                        self.submit(f"d{key[1:]}", path, writes=writes, mode=mode, dedupe=True)
                else:
                    self.submit(
                        key,
                        path,
                        writes=writes,
                        mode=path if path in ("retry", "requeue") else "plain",
                        by_name=path == "send_task",
                    )
                if self.rng.random() < self.settings.duplicates:
                    # A hand-over, preempt or limited job's duplicate is one of its own
                    # (the same lease): a preempt duplicate takes the key over from its
                    # original.
                    own = path in ("coalesce", "queue", "preempt", "limited")
                    self.submit(key, path if own else "duplicate")
            except Exception as exc:  # the broker is never faulted: worth reporting
                self.errors.append(repr(exc))
            next_at += period
            self.halt.wait(max(0.0, next_at - time.monotonic()))

    def _debounce(self, key: str, writes: int) -> None:
        """Publish the debounce job for ``key`` 1 to 4 times, 0.1 to 0.4 s apart (under the
        quiet time: one burst), or, one time in five, every 0.3 s for 3 s (past the cap: a
        stream the cap must cut), from a thread of its own; some jobs retry once."""
        count, gap = (10, 0.3) if self.rng.random() < 0.2 else (self.rng.randint(1, 4), None)
        gaps = [gap or self.rng.uniform(0.1, 0.4) for _ in range(count)]
        mode = self.rng.choice(["plain", "plain", "plain", "retry"])

        def publish() -> None:
            for pause in gaps:
                try:
                    self.submit(key, "debounce", writes=writes, mode=mode)
                except Exception as exc:
                    self.errors.append(repr(exc))
                if self.halt.wait(pause):
                    return

        threading.Thread(target=publish, daemon=True, name=f"debounce-{key}").start()


def _resolve_debounced(app: Any, job: Job, ran_tasks: set[str]) -> None:
    """A ``lease_debounce`` job ends as its burst's run (the task id every publish got)."""
    burst = job.folded_onto or job.task_id
    if burst in ran_tasks:
        job.resolution, job.detail = "ran", f"in burst {burst}"
        return
    result = app.AsyncResult(burst)
    if result.state == "FAILURE" and type(result.result).__name__ in LEASE_ERRORS:
        job.resolution, job.detail = "failed_lease", f"burst {burst}: {result.result}"
    else:
        job.detail = f"burst {burst}: state {result.state}"


def _resolve(app: Any, job: Job, ran: set[str], jobs_by_task: dict[str, Job]) -> None:
    """Fill in how ``job`` ended from the executions and the result backend; a folded
    ``lease_dedupe`` job ends as the copy it was folded onto."""
    if job.folded_onto is not None:
        copy = jobs_by_task.get(job.folded_onto)
        if copy is not None and copy.folded_onto is None:
            _resolve(app, copy, ran, jobs_by_task)
            job.resolution, job.holder = copy.resolution, copy.holder
            job.detail = f"folded onto {copy.task_id} (job {copy.job}): {copy.detail}"
        else:
            job.detail = f"folded onto {job.folded_onto}, a copy no job published"
        return
    result = app.AsyncResult(job.task_id)
    state = result.state
    value = result.result
    if isinstance(value, dict) and value.get("lease_skipped"):
        job.resolution, job.holder = "skipped", str(value.get("holder") or "")
        job.detail = f"skipped, held by task {value.get('holder_task_id')}"
    elif is_coalesced(value):
        covering = value
        for _ in range(20):  # a pending run coalesced in turn (after a crash) names the next
            job.covered_by = str(covering["into"])
            covering = app.AsyncResult(job.covered_by).result
            if not is_coalesced(covering):
                break
        job.resolution, job.detail = "coalesced", f"covered by {job.covered_by}"
    elif job.job in ran:
        job.resolution, job.detail = "ran", state
    elif state == "FAILURE" and type(value).__name__ in LEASE_ERRORS:
        job.resolution, job.detail = "failed_lease", f"{type(value).__name__}: {value}"
    else:
        job.detail = f"state {state}: {value!r}"[:300]


def run_campaign(settings: Settings, say: Any = print) -> History:
    """Run one campaign and return its recorded history (the database is dropped)."""
    rng = random.Random(settings.seed)
    # One stream each, drawn before any thread runs: the same seed, the same plan.
    producer_rng, nemesis_rng = random.Random(rng.random()), random.Random(rng.random())
    log_dir = settings.log_dir or tempfile.mkdtemp(prefix="chaos-")
    dsn = db.create_database()
    results = None if settings.broker_url else RedisServer().start()
    result_url = settings.broker_url or results.url()  # type: ignore[union-attr]
    broker_url = settings.broker_url or os.environ.get("CHAOS_AMQP_URL") or DEFAULT_AMQP_URL
    store, proxy, lease_url, lease_ports = _lease_store(settings)
    queue = f"chaos-{uuid.uuid4().hex[:8]}"  # never another application's queue
    env = {
        "CHAOS_BROKER_URL": broker_url,
        "CHAOS_RESULT_URL": result_url,
        "CHAOS_QUEUE": queue,
        "CHAOS_DSN": dsn,
        "CHAOS_LEASE_URL": lease_url,
        "CHAOS_LEASE_OPTIONS": json.dumps(getattr(store, "options", {})),
        "CHAOS_TTL": str(settings.ttl),
        "CHAOS_COOLDOWN": str(settings.cooldown),
        "CHAOS_PREEMPT_GRACE": str(settings.preempt_grace),
        "CHAOS_LIMIT": str(settings.limit),
        "CHAOS_DEBOUNCE_MIN_REPLICAS": str(settings.debounce_min_replicas),
        "CHAOS_DEDUPE_MIN_REPLICAS": str(settings.dedupe_min_replicas),
        "CHAOS_BEAT_KEYS": ",".join(f"k{i}" for i in range(min(settings.beat_keys, settings.keys))),
        "CHAOS_BEAT_PERIOD": str(settings.beat_period),
    }
    os.environ.update(env)  # the producer's copy of the app reads them at import
    from . import worker_app

    fleet = Fleet("example_project.chaos.worker_app", env, log_dir, queue)
    try:
        say(
            f"chaos: seed {settings.seed}, {settings.workers} workers, {settings.beats} beats, "
            f"{settings.keys} keys, {settings.duration:.0f}s, TTL {settings.ttl}s"
            f"{', Sentinel' if settings.sentinel else ''}; logs in {log_dir}"
        )
        fleet.start(settings.workers, beats=settings.beats)
        started = time.time()
        producer = _Producer(settings, producer_rng, worker_app.submit)
        producer.start()
        wait_for(lambda: time.time() - started > min(5.0, settings.duration / 4), 30)
        sampler = _start_sampler(fleet, broker_url, result_url, lease_ports)
        nemesis = _nemesis(settings, nemesis_rng, fleet, store, proxy, worker_app)
        nemesis.run(until=started + settings.duration)
        nemesis_end = time.time()
        producer.halt.set()
        fleet.stop_beats()  # beat is a submission path: it stops with the producer
        producer.join(10)
        say(f"chaos: nemesis done ({len(nemesis.faults)} faults); draining")
        _drain_and_probe(dsn, store, worker_app, settings)
        sampler.halt.set()
        history = _record(settings, dsn, worker_app, fleet, store, sampler, started, nemesis_end)
        history.faults = nemesis.faults
        if settings.broker_url:  # someone else's Redis: take away what the run left there
            _forget(broker_url, queue, [job.task_id for job in history.jobs])
        for error in nemesis.errors + producer.errors:
            say(f"chaos: note: {error}")
        return history
    finally:
        fleet.close()
        if not settings.broker_url:
            _delete_queue(worker_app.app, queue)
        if proxy is not None:
            proxy.close()
        store.close()
        if results is not None:
            results.close()
        worker_app.recorder().close()
        db.drop_database(dsn)


def _lease_store(settings: Settings) -> tuple[Any, TcpProxy | None, str, list[int]]:
    """The lease store a campaign starts: ``(store, proxy, lease URL, ports)``. With
    ``settings.sentinel`` a Sentinel-managed primary and its replica (no proxy), else one
    noeviction Redis behind a TCP proxy the nemesis can cut; ``ports`` are those the workers
    connect to (what the sampler counts as lease connections)."""
    if settings.sentinel:
        sentinel = SentinelStore()
        return sentinel, None, sentinel.url, sentinel.ports
    store = RedisServer(config={"maxmemory-policy": "noeviction"}).start()
    proxy = TcpProxy(store.port)
    return store, proxy, f"redis://127.0.0.1:{proxy.port}/0", [proxy.port]


def _start_sampler(
    fleet: Fleet, broker_url: str, result_url: str, lease_ports: list[int]
) -> _Sampler:
    """Start sampling the fleet's workers, their connections named by the peer's port: the
    broker, the result backend, PostgreSQL (5432) and the lease store."""
    peers = {
        _port(broker_url): "broker",
        _port(result_url): "results",
        5432: "postgres",
        **{port: "lease" for port in lease_ports},
    }
    sampler = _Sampler(fleet, peers)
    sampler.start()
    return sampler


def _nemesis(
    settings: Settings,
    rng: random.Random,
    fleet: Fleet,
    store: Any,
    proxy: TcpProxy | None,
    worker_app: Any,
) -> Nemesis:
    """The campaign's nemesis, its faults drawn from ``rng``; a fault that erases lease keys
    has each erased job key requested again (``"after_erase"``), the duplicate the checker
    expects to be refused or to run after the erased holder."""
    job_keys = {
        worker_app.chaos_job.lease_key_for((), {"key": f"k{i}", "job": ""}): f"k{i}"
        for i in range(settings.keys)
    }

    def duplicate(lease_keys: list[str]) -> None:
        for lease_key in lease_keys:
            if lease_key in job_keys:
                worker_app.submit(job_keys[lease_key], "after_erase")

    return Nemesis(
        rng,
        fleet,
        store,
        proxy,
        settings.ttl,
        lambda c: _lease_keys(c, worker_app.LEASE_PREFIX),
        duplicate,
        SENTINEL_FAULTS if settings.sentinel else FAULTS,
    )


def _drain_and_probe(dsn: str, store: Any, worker_app: Any, settings: Settings) -> None:
    """After the faults: let the waiting runs drain, run one probe job per key (after a
    cooldown, or the last job's window would skip it) and wait for every probe, then one TTL
    (and a cooldown, float seconds) more, so that the history ends with the store quiet.

    Raises:
        AssertionError: the probes did not finish in time (:func:`wait_for`).
    """
    _drain(dsn, store, worker_app, settings)
    time.sleep(settings.cooldown)  # a probe in the last job's window would be skipped
    probes = [worker_app.submit(f"k{i}", "probe") for i in range(settings.keys)]
    wait_for(
        lambda: all(worker_app.app.AsyncResult(p.task_id).ready() for p in probes),
        settings.ttl * 4 + 30,
        interval=0.2,
        message="probes did not finish",
    )
    time.sleep(settings.ttl + settings.cooldown)  # one TTL (and a cooldown) after the end


def _port(url: str) -> int:
    default = 5672 if url.startswith("amqp") else 6379
    return urlsplit(url).port or default


def _delete_queue(app: Any, queue: str) -> None:
    """Delete the run's queue from the RabbitMQ the run did not start (best effort)."""
    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    except Exception as exc:  # the run's result does not depend on it
        print(f"chaos: could not delete queue {queue}: {exc!r}")


def _forget(broker_url: str, queue: str, task_ids: list[str]) -> None:
    """Delete the run's results and queue keys from a broker Redis the run did not start."""
    client = redis.Redis.from_url(broker_url)
    try:
        names = [f"celery-task-meta-{task_id}" for task_id in task_ids]
        names += [queue, f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"]
        for start in range(0, len(names), 500):
            client.delete(*names[start : start + 500])
    finally:
        client.close()


def _waiting(client: redis.Redis, worker_app: Any) -> list[str]:
    """The keys with runs still waiting for a hand-over (a line, a reservation not taken)."""
    found = [_text(k) for k in client.scan_iter(match=f"{worker_app.LEASE_PREFIX}*:line")]
    return found + [
        _text(k)
        for k in client.scan_iter(match=f"{worker_app.LEASE_PREFIX}*:reserved")
        if client.hget(k, "id")
    ]


def _drain(dsn: str, store: Any, worker_app: Any, settings: Settings) -> None:
    """Wait until every job has ended and no lease is held (or ``settings.drain`` passes)."""
    leases = store.client()

    def idle() -> bool:
        if _lease_keys(leases, worker_app.LEASE_PREFIX) or _waiting(leases, worker_app):
            return False
        return all(worker_app.app.AsyncResult(task_id).ready() for task_id in db.unfinished(dsn))

    try:
        wait_for(idle, settings.drain, interval=0.5)
    except AssertionError:
        pass  # whatever is still unresolved is reported by the checker
    finally:
        leases.close()


def _record(
    settings: Settings,
    dsn: str,
    worker_app: Any,
    fleet: Fleet,
    store: Any,
    sampler: _Sampler,
    started: float,
    nemesis_end: float,
) -> History:
    writes, runs, jobs, parked = db.load(dsn)
    preemptions = db.load_preemptions(dsn)
    ran = {r.job for r in runs if r.outcome == "ok"}
    jobs_by_task = {job.task_id: job for job in jobs}
    ran_tasks = {r.task_id for r in runs if r.outcome == "ok"}
    for job in jobs:
        if job.path == "debounce":  # "unguarded" too: it may have fired its own burst
            _resolve_debounced(worker_app.app, job, ran_tasks)
        else:
            _resolve(worker_app.app, job, ran, jobs_by_task)
    leases = store.client()
    try:
        leftover = []
        for key in _lease_keys(leases, worker_app.LEASE_PREFIX):
            value = (
                leases.get(key) if leases.type(key) == b"string" else leases.hgetall(key)
            )  # a hash of slots (lease_limit)
            leftover.append({"key": key, "pttl": leases.pttl(key), "value": _text(value)})
        # Every key has a lifetime, the beat's last-run record included (ten periods).
        no_ttl = [
            _text(k)
            for k in leases.scan_iter(match=f"{worker_app.LEASE_PREFIX}*")
            if leases.ttl(k) == -1
        ]
        claims = [dataclasses.asdict(c) for c in scan_claims(leases, worker_app.LEASE_PREFIX)]
    finally:
        leases.close()
    samples = []
    for slot in fleet.slots:
        names = [slot.worker.hostname]
        answered = bool(worker_app.app.control.ping(destination=names, timeout=5.0))
        pid = slot.worker.pid
        rss, sockets, by_peer = _resources(pid, sampler.peers)
        measured = pid in sampler.baseline
        rss0, sockets0, by_peer0 = sampler.baseline.get(pid, (0, 0, {}))
        samples.append(
            WorkerSample(
                slot.name,
                slot.pool,
                slot.restarts,
                answered,
                measured,
                rss0,
                rss,
                sockets0,
                sockets,
                by_peer0,
                by_peer,
                round(time.time() - sampler.first_seen.get(pid, time.time()), 1),
            )
        )
    return History(
        ttl=settings.ttl,
        started_at=started,
        nemesis_end=nemesis_end,
        finished_at=time.time(),
        writes=writes,
        executions=runs,
        jobs=jobs,
        parked=parked,
        workers=samples,
        leftover_leases=leftover,
        keys_without_ttl=no_ttl,
        leftover_claims=claims,
        cooldown=settings.cooldown,
        preemptions=preemptions,
        preempt_grace=settings.preempt_grace,
        limit=settings.limit,
        debounce_cap=worker_app.DEBOUNCE_CAP,
        dedupe_min_replicas=settings.dedupe_min_replicas,
        debounce_min_replicas=settings.debounce_min_replicas,
    )
