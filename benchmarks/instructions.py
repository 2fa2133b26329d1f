"""``python -m benchmarks.instructions [--count N] [--out DIR]``: instructions per execution.

Counts user-space instructions with callgrind (``valgrind --tool=callgrind``), which gives the
same count for the same binary and input, where CPU time on a shared machine moves by ±15%
from one run to the next. One child process runs every measured section against a private
redis-server (not under valgrind: only the client is counted); a call to ``os.getppid()``
marks the boundary of each section (``--dump-before=os_getppid*`` makes callgrind write the
cost since the previous mark), so one valgrind run gives every figure. Each section repeats
one operation ``count`` times after a warm-up of 100 (the first executions of a task cost
more: with a warm-up of 30 and 200 a section, plain ``Task`` counted 237 k instead of 200 k);
its figure is the section's instructions, minus those of the same loop calling a no-op,
divided by ``count``.

Sections:

- ``worker/<variant>``: one execution as a worker runs it (Celery's tracer, ``build_tracer``,
  with the request a worker passes), for plain ``Task``, plain + one ``PING``, ``LeasedTask``
  (and with its release waited for), celery-singleton and celery-once: what each adds on the
  worker side is its figure minus plain's;
- ``publisher/<variant>``: one ``apply_async`` to a Redis broker for the same variants:
  celery-singleton and celery-once take their lock there;
- ``step/<name>``: each step of a leased execution alone (key, acquire, heartbeat
  registration, interrupt set-up, release, signals and logs...), as
  :mod:`celery_lease.core.lifecycle` and :class:`~celery_lease.LeasedTask` run them;
- then, with hiredis, a whole solo worker under callgrind (:mod:`benchmarks.worker_instructions`:
  the consumer, the request and the pool's accept included), in ``whole_worker``.

``--no-hiredis`` hides the ``hiredis`` package from the child (redis-py's pure-Python parser),
so the two can be compared on one machine. Writes ``instructions.json`` into ``--out``
(default ``docs/benchmarks/``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

if os.environ.get("BENCH_NO_HIREDIS"):  # before redis-py is imported: its pure-Python parser
    sys.modules["hiredis"] = None  # type: ignore[assignment]

from harness import REPO_ROOT
from harness.redis_server import RedisServer

from . import worker_instructions

WORKER_VARIANTS = ("plain", "floor1", "leased", "leased_sync", "singleton", "once")
PUBLISHER_VARIANTS = ("plain", "leased", "singleton", "once")
#: step name -> what it covers (the per-step figures of docs/benchmarks.md).
STEPS = {
    "settings_client": "settings and store client lookup (lease_settings, client_for)",
    "key": "key: bind the arguments, encode, BLAKE2b (build_key)",
    "token_holder": "token and holder JSON",
    "settle_none": "previous releases' replies, none pending (pending.settle_all)",
    "acquire": "acquire: the script call, one round trip (store.acquire)",
    "interrupt": "interrupt set-up and finish (for_current_context, finish)",
    "lease_object": "the Lease object (its lock, deadlines, renewal arguments)",
    "heartbeat": "heartbeat registration and removal (add, remove)",
    "release": "release written, then its reply read (pending.write, settle_all)",
    "signals_logs": "signals, debug logs and records (lease_acquired, announce_end...)",
    "ping_redis_py": "reference: one PING through redis-py's execute_command",
    "ping_wire": "reference: one PING through celery_lease.store.wire",
}
DEFAULT_COUNT = 600


def _marker() -> None:
    os.getppid()  # callgrind dumps before this call: a boundary between two intervals


class _Sections:
    """The child's measured sections, each between two markers.

    Attributes:
        count: the measured calls of each section (int).
        labels: what each interval between two markers is, in order: a section's name, or
            ``"-"`` for what ran since the previous mark (a warm-up, a set-up).
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.labels: list[str] = []

    def run(self, label: str, fn: Callable[[int], Any], warm: int = 100) -> None:
        """``fn(i)`` for each ``i`` of ``range(count)``, between two markers, the interval named
        ``label``; after ``warm`` warm-up calls (``fn(-1)``, ``fn(-2)``...) outside it."""
        for i in range(warm):
            fn(-1 - i)
        # A full collection lands in whichever section allocates past its threshold: what
        # exists now is left out of them, so the young collections a section causes count.
        gc.collect()
        gc.freeze()
        _marker()  # the interval since the previous mark (a warm-up) is labelled "-"
        self.labels.append("-")
        for i in range(self.count):
            fn(i)
        _marker()
        self.labels.append(label)


def _run_sections(url: str, count: int, labels_path: Path) -> None:
    """The child: every section between two markers; the labels, in order, to ``labels_path``."""
    from .app import make_app

    os.environ["BENCH_BROKER"] = url
    app = make_app(url)
    app.finalize()
    sections = _Sections(count)

    def noop(i: int) -> None:
        return None

    sections.run("noop", noop)
    _worker_sections(app, sections)
    _publisher_sections(app, url, sections)
    _step_sections(app, url, sections)
    labels_path.write_text(json.dumps(sections.labels))


def _worker_sections(app: Any, sections: _Sections) -> None:
    """``worker/<variant>``: one execution of each worker variant as a worker runs it (Celery's
    tracer, with the request a worker passes), arguments new each time."""
    import uuid

    from celery.app.trace import build_tracer

    for variant in WORKER_VARIANTS:
        task = app.tasks[f"bench.{variant}"]
        tracer = build_tracer(task.name, task, app=app, hostname="bench@cg", eager=False)
        run = uuid.uuid4().hex[:8]

        def execute(i: int, task: Any = task, tracer: Any = tracer, run: str = run) -> None:
            task_id = uuid.uuid4().hex
            args = (run, i, 10**9)
            tracer(
                task_id,
                args,
                {},
                {
                    "id": task_id,
                    "task": task.name,
                    "hostname": "bench@cg",
                    "args": args,
                    "kwargs": {},
                    "is_eager": False,
                    "headers": None,
                    "delivery_info": {
                        "exchange": "",
                        "routing_key": "cg",
                        "priority": 0,
                        "redelivered": False,
                    },
                },
            )

        sections.run(f"worker/{variant}", execute)


def _publisher_sections(app: Any, url: str, sections: _Sections) -> None:
    """``publisher/<variant>``: one ``apply_async`` of each publisher variant to the broker at
    ``url``, on one producer; each variant's messages deleted after its section."""
    import uuid

    from celery_lease import store

    records = store.client_for(url, 5.0)
    with app.producer_or_acquire() as producer:
        for variant in PUBLISHER_VARIANTS:
            task = app.tasks[f"bench.{variant}"]
            run = uuid.uuid4().hex[:8]

            def publish(i: int, task: Any = task, run: str = run) -> None:
                task.apply_async((run, i, 10**9), queue="cg-hold", producer=producer)

            sections.run(f"publisher/{variant}", publish)
            records.delete("cg-hold")


def _step_sections(app: Any, url: str, sections: _Sections) -> None:
    """``step/<name>``: each step of a leased execution alone (:data:`STEPS`), as
    :mod:`celery_lease.core.lifecycle` runs them, on keys and tokens made beforehand (the
    acquire section's keys are those the release section releases)."""
    import socket
    import uuid

    from celery_lease import store
    from celery_lease.base import clock, signals
    from celery_lease.base.keys import build_key
    from celery_lease.core import interrupt, lifecycle
    from celery_lease.core.heartbeat import heartbeat
    from celery_lease.core.lease import Lease
    from celery_lease.store import pending

    leased = app.tasks["bench.leased"]
    options, lease_url, signum = leased.lease_settings()
    client = store.client_for(lease_url, options.store_timeout, options.backend_options)
    sig, spec = type(leased)._lease_signature, leased._lease_key_spec()
    holder = lifecycle.HolderInfo(leased.name, "task-id", socket.gethostname())
    run = uuid.uuid4().hex[:8]
    keys = [f"cg:{run}:{i}" for i in range(sections.count + 100)]  # the last 100: warm-ups
    tokens = [os.urandom(16).hex() for _ in keys]

    def settings_client(i: int) -> None:
        o, u, _ = leased.lease_settings()
        store.client_for(u, o.store_timeout, o.backend_options)

    def acquire(i: int) -> None:
        store.acquire(client, keys[i], tokens[i], options.ttl_ms, "{}", options.min_replicas)

    target = interrupt.for_current_context(signum)

    def make_lease(i: int) -> Lease:
        return Lease(
            key=keys[i],
            token=tokens[i],
            fencing_token=1,
            task_name=leased.name,
            task_id="task-id",
            options=options,
            client=client,
            target=target,
            sent_at=clock.now(),
        )

    leases = [make_lease(i) for i in range(len(keys))]

    def register(i: int) -> None:
        heartbeat(signum).add(leases[i])
        heartbeat().remove(leases[i])

    def release(i: int) -> None:
        pending.write(client, keys[i], tokens[i], options.ttl, lambda done: None)
        pending.settle_all()

    def signals_logs(i: int) -> None:
        lease = leases[i]
        if signals.lease_acquired.receivers:
            signals.lease_acquired.send(sender=leased, key=lease.key)
        lifecycle.logger.debug(
            "lease acquired: key=%s task=%s[%s] token=%s fencing_token=%d ttl=%.3fs",
            lease.key,
            lease.task_name,
            lease.task_id,
            lease.token,
            lease.fencing_token,
            options.ttl,
        )
        heartbeat().wake_for_pending()
        lifecycle.announce_end(lease, None, None, sender=leased)

    ping = store.client_for(url, 5.0)
    steps: dict[str, Callable[[int], Any]] = {
        "settings_client": settings_client,
        "key": lambda i: build_key(options.key_prefix, leased.name, sig, spec, (run, i, 10**9), {}),
        "token_holder": lambda i: (os.urandom(16).hex(), holder.to_json()),
        "settle_none": lambda i: pending.settle_all(),
        "acquire": acquire,
        "interrupt": lambda i: interrupt.for_current_context(signum).finish(),
        "lease_object": make_lease,
        "heartbeat": register,
        "release": release,
        "signals_logs": signals_logs,
        "ping_redis_py": lambda i: ping.execute_command("PING"),
        "ping_wire": lambda i: store.wire.call(ping, "PING"),
    }
    for name, fn in steps.items():
        # The acquire section's keys (their warm-up ones too) are what the release releases.
        sections.run(f"step/{name}", fn, warm=0 if name in ("acquire", "release") else 100)


def _cost(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise ValueError(f"{path}: no summary line")


def measure(count: int = DEFAULT_COUNT, hiredis: bool = True) -> dict[str, Any]:
    """Run the sections under callgrind; returns instructions per operation per section.

    Raises:
        RuntimeError: valgrind is not installed, or the child failed.
    """
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    work = Path(tempfile.mkdtemp(prefix="celery-lease-cg-"))
    labels_path = work / "labels.json"
    env = dict(os.environ, PYTHONHASHSEED="0")
    if not hiredis:
        env["BENCH_NO_HIREDIS"] = "1"
    try:
        with RedisServer() as server:
            proc = subprocess.run(
                [
                    valgrind,
                    "--tool=callgrind",
                    "--dump-before=os_getppid*",
                    "--separate-threads=yes",
                    f"--callgrind-out-file={work / 'cg.out'}",
                    sys.executable,
                    "-m",
                    "benchmarks.instructions",
                    "--child",
                    server.url(),
                    str(labels_path),
                    "--count",
                    str(count),
                ],
                cwd=REPO_ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=3600,
            )
        if proc.returncode != 0 or not labels_path.exists():
            raise RuntimeError(
                f"callgrind child failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        labels = json.loads(labels_path.read_text())
        # Dump k holds what ran up to mark k since mark k - 1 (dump 1: the start-up too),
        # one file per thread: cg.out.<k>-<thread>, thread 01 the main one.
        costs: dict[str, int] = {}
        for number, label in enumerate(labels, start=1):
            files = sorted(work.glob(f"cg.out.{number}-*"))
            if not files:
                raise RuntimeError(f"no callgrind dump {number} of {len(labels)}")
            costs[label] = _cost(files[0])
        if list(work.glob(f"cg.out.{len(labels) + 1}-*")):
            raise RuntimeError(
                "more callgrind dumps than intervals: something else called os.getppid()"
            )
        # Only the thread that calls os.getppid() dumps: the others' cost (the heartbeat's)
        # is in the final files, for the whole run.
        other_threads = sum(_cost(f) for f in work.glob("cg.out-*") if not f.name.endswith("-01"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = costs.pop("noop")
    per_op = {label: round((cost - base) / count) for label, cost in costs.items() if label != "-"}
    # The heartbeat thread apart: its wake-ups depend on timing, the main thread's count not.
    return {
        "count": count,
        "hiredis": hiredis,
        "per_operation": per_op,
        "heartbeat_thread_whole_run": other_threads,
        **derived(per_op),
    }


def derived(per_op: dict[str, int]) -> dict[str, Any]:
    """What each library adds to a plain ``Task``, worker and publisher side, and the target."""
    worker = {v: per_op[f"worker/{v}"] - per_op["worker/plain"] for v in WORKER_VARIANTS}
    publisher = {
        v: per_op[f"publisher/{v}"] - per_op["publisher/plain"] for v in PUBLISHER_VARIANTS
    }
    total = {v: worker[v] + publisher.get(v, 0) for v in worker}
    steps = {name: per_op[f"step/{name}"] for name in STEPS}
    measured = sum(v for k, v in steps.items() if not k.startswith("ping"))
    return {
        "worker_added": worker,
        "publisher_added": publisher,
        "total_added": total,
        "steps": steps,
        "steps_rest": worker["leased"] - measured,
        "lease_vs_peers": {
            peer: round(worker["leased"] / total[peer], 3) for peer in ("singleton", "once")
        },
    }


def markdown(result: dict[str, Any]) -> str:
    """The per-step table and the comparison with the peers, as Markdown."""
    lines = [
        f"Instructions per execution (callgrind, {result['count']} executions per "
        f"section, hiredis {'installed' if result['hiredis'] else 'not installed'}):",
        "",
        "| what each adds to a plain Task | worker | publisher | total |",
        "|---|---:|---:|---:|",
    ]
    labels = {
        "floor1": "plain + 1 x PING in the body",
        "leased": "celery-lease LeasedTask",
        "leased_sync": "celery-lease, release waited for",
        "singleton": "celery-singleton",
        "once": "celery-once",
    }
    for variant, label in labels.items():
        worker = result["worker_added"][variant]
        pub = result["publisher_added"].get(variant)
        lines.append(
            f"| {label} | {worker / 1000:,.0f} k | "
            f"{'n/a' if pub is None else f'{pub / 1000:,.0f} k'} | "
            f"{result['total_added'][variant] / 1000:,.0f} k |"
        )
    lines += ["", "| step of a leased execution (worker) | instructions |", "|---|---:|"]
    for name, what in STEPS.items():
        lines.append(f"| {what} | {result['steps'][name] / 1000:,.1f} k |")
    lines.append(
        f"| the rest: LeasedTask.__call__, Claim, context variable, lifecycle "
        f"bookkeeping | {result['steps_rest'] / 1000:,.1f} k |"
    )
    whole = result.get("whole_worker")
    if whole is not None:
        lines += [
            "",
            f"A whole solo worker (benchmarks.worker_instructions, {whole['calls']} "
            f"calls per variant, publisher left out):",
            "",
            "| variant | instructions per execution | added to plain |",
            "|---|---:|---:|",
        ]
        for variant, count in whole["per_execution"].items():
            lines.append(
                f"| {labels.get(variant, 'plain Task')} | {count / 1000:,.0f} k | "
                f"{whole['added'][variant] / 1000:,.0f} k |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "benchmarks")
    parser.add_argument(
        "--no-hiredis",
        action="store_true",
        help="hide the hiredis package from the measured process",
    )
    parser.add_argument("--child", nargs=2, metavar=("URL", "LABELS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _run_sections(args.child[0], args.count, Path(args.child[1]))
        return 0
    result = measure(args.count, hiredis=not args.no_hiredis)
    if not args.no_hiredis:  # the whole worker, as the end-to-end benchmark runs it
        result["whole_worker"] = worker_instructions.measure()
    args.out.mkdir(parents=True, exist_ok=True)
    name = "instructions.json" if not args.no_hiredis else "instructions-no-hiredis.json"
    (args.out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
