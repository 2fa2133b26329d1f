"""Measure celery-lease, celery-once and celery-singleton on the same faults, on real workers.

Three scenes, each run once per library against two ``celery worker -P prefork -c 2``
processes (A and B) and a private or given Redis, all three libraries given the same short
lifetime (``--lock``, float seconds):

- **crash**: the holder's worker is SIGKILLed mid-run and the job is requested again every
  0.25 s on B. Measured: the lock's remaining lifetime right after the kill (with the short
  lifetime, and with each library's defaults) and how long until the job runs again.
- **slow run**: a run three lifetimes long on A while the job is requested every 0.5 s on B.
  Measured: how many executions of the job ran at once.
- **pause**: A is SIGSTOPped for 1.25 lifetimes, the job is requested every 0.25 s on B, and A
  resumes (and, unless stopped, ends) while B's run is in progress. Measured: whether A
  learns it lost the claim, how much work A does after resuming, whether A's release deletes
  B's lock, and whether a third execution starts while B runs.

Behaviour only: speed is measured by ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from example_project.demo import runtime
from example_project.demo.runtime import EmbeddedRedis, Processes, Worker
from harness.waiting import poll

LIBS = ("celery-lease", "celery-once", "celery-singleton")


class Bench:
    """Two workers, a Redis, the event list, and a way to reset between scenes.

    Every key written is under ``prefix`` (Celery's broker and results, celery-lease,
    celery-singleton, the event list) except celery-once's locks, whose ``qo_`` prefix cannot
    be configured: :meth:`send` remembers those, and :meth:`delete_keys` removes both.
    """

    def __init__(self, url: str, prefix: str, lock: float, processes: Processes) -> None:
        env = {"REDIS_URL": url, "CMP_PREFIX": prefix, "CMP_LOCK": repr(lock)}
        os.environ.update(env)
        from example_project.compare import app as cmp

        self.cmp = cmp
        self.lock = lock
        self.prefix = prefix
        self.client = runtime.quick_client(url, 2.0)
        self.lock_keys: set[str] = set()  # every lock key a job sent could have created
        self.processes = processes
        self.workers = {
            k: Worker(k, "prefork", env, app_module="example_project.compare.app") for k in "AB"
        }
        self.events: list[dict[str, Any]] = []
        self._index = 0

    def say(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def restart(self) -> None:
        """Kill both workers (whatever they run) and start fresh ones; wait until ready."""
        for worker in self.workers.values():
            if worker.child is not None and worker.child.is_running():
                worker.child.kill()
            worker.start(self.processes)
        ok = poll(
            lambda: all(w.ready() for w in self.workers.values()),
            60,
            0.05,
            lambda e: self.say(f"    starting workers A and B: {e:.0f}s (gives up at 60s)"),
        )
        if not ok:
            raise RuntimeError("workers not ready")

    def poll(self) -> None:
        raw = self.client.lrange(self.cmp.EVENTS_KEY, self._index, -1)
        self._index += len(raw)
        self.events.extend(json.loads(x) for x in raw)

    def of(
        self, job: str, kind: str | None = None, worker: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["job"] == job
            and (kind is None or e["ev"] == kind)
            and (worker is None or e["w"] == worker)
        ]

    def wait(
        self,
        what: str,
        predicate: Callable[[], bool],
        timeout: float,
        each: Callable[[], None] | None = None,
    ) -> bool:
        """Poll until ``predicate()`` or ``timeout`` float seconds; says what it waits for.

        ``each()`` runs on every poll (e.g. to send the next duplicate request). Once a second
        a line says what it waits for and for how long so far.
        """
        started = time.monotonic()
        last_tick = started
        while time.monotonic() - started < timeout:
            self.poll()
            if each is not None:
                each()
            if predicate():
                return True
            now = time.monotonic()
            if now - last_tick >= 1.0:
                last_tick = now
                self.say(
                    f"    waiting for {what}: {now - started:.0f}s (gives up at {timeout:.0f}s)"
                )
            time.sleep(0.05)
        return False

    def delete_keys(self) -> int:
        """Delete every key this run wrote (see the class docstring); returns how many."""
        keys = set(self.client.scan_iter(match=self.prefix + "*", count=1000))
        keys.update(k.encode() for k in self.lock_keys)
        found = sorted(keys)
        deleted = 0
        for start in range(0, len(found), 500):
            deleted += int(self.client.delete(*found[start : start + 500]))
        return deleted

    def send(self, lib: str, variant: str, worker: str, job: str, seconds: float) -> None:
        self.lock_keys.add(self.key(lib, variant, job, seconds))
        task = self.cmp.TASKS[(lib, variant)]
        task.apply_async(
            (job, seconds), queue=self.workers[worker].queue, task_id=str(uuid.uuid4())
        )

    def key(self, lib: str, variant: str, job: str, seconds: float) -> str:
        return self.cmp.lock_key(lib, self.cmp.TASKS[(lib, variant)], job, seconds)

    def pttl(self, key: str) -> float | None:
        """Remaining lifetime of ``key`` in float seconds; None when absent; inf when none."""
        value = int(self.client.pttl(key))
        if value == -2:
            return None
        return float("inf") if value == -1 else value / 1000


def _spans(
    bench: Bench, job: str, pauses: dict[str, tuple[float, float]] | None = None
) -> list[tuple[float, float]]:
    """Wall-clock intervals in which an execution of ``job`` was running (not frozen)."""
    spans = []
    now = time.time()
    for start in bench.of(job, "start"):
        same = [
            e
            for e in bench.of(job)
            if e["pid"] == start["pid"] and e["t"] >= start["t"] and e["ev"] in ("end", "lost")
        ]
        end = same[0]["t"] if same else now
        frozen = (pauses or {}).get(start["w"])
        if frozen and start["t"] < frozen[0] < end:
            spans += [(start["t"], frozen[0]), (frozen[1], end)]
        else:
            spans.append((start["t"], end))
    return spans


def _max_running(spans: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    depth = best = 0
    for _, delta in points:
        depth += delta
        best = max(best, depth)
    return best


def crash(bench: Bench, lib: str) -> dict[str, Any]:
    """SIGKILL the holder; measure the lock left and the stall until the job runs again."""
    figures: dict[str, Any] = {}
    a = bench.workers["A"]
    # With the library's defaults: only the lock left after the kill (the stall would be it).
    job = f"crash-default-{uuid.uuid4().hex[:6]}"
    bench.send(lib, "default", "A", job, 60)
    bench.wait("A to start the job", lambda: bool(bench.of(job, "start")), 15)
    assert a.child is not None
    a.child.kill()
    left = bench.pttl(bench.key(lib, "default", job, 60))
    figures["lock left after SIGKILL, library defaults (s)"] = (
        "no expiry" if left == float("inf") else left
    )
    bench.restart()
    # With the short lifetime: measure the stall.
    job = f"crash-{uuid.uuid4().hex[:6]}"
    bench.send(lib, "short", "A", job, 60)
    bench.wait("A to start the job", lambda: bool(bench.of(job, "start")), 15)
    assert a.child is not None
    killed = time.time()
    a.child.kill()
    left = bench.pttl(bench.key(lib, "short", job, 60))
    figures["lock left after SIGKILL (s)"] = "no expiry" if left == float("inf") else left
    next_request = [0.0]

    def request() -> None:
        if time.monotonic() >= next_request[0]:
            next_request[0] = time.monotonic() + 0.25
            bench.send(lib, "short", "B", job, 1.0)

    window = 3 * bench.lock + 5
    ran = bench.wait(
        "B to run the job again (requested every 0.25 s)",
        lambda: bool(bench.of(job, "start", "B")),
        window,
        request,
    )
    stall = round(bench.of(job, "start", "B")[0]["t"] - killed, 2) if ran else None
    figures["stall until the job ran again (s)"] = (
        stall if stall is not None else f"> {window:.0f} (not run)"
    )
    return figures


def slow(bench: Bench, lib: str) -> dict[str, Any]:
    """A run three lifetimes long, duplicates requested every 0.5 s: executions at once."""
    job = f"slow-{uuid.uuid4().hex[:6]}"
    seconds = 3 * bench.lock
    bench.send(lib, "short", "A", job, seconds)
    bench.wait("A to start the job", lambda: bool(bench.of(job, "start", "A")), 15)
    next_request = [time.monotonic() + 0.5]

    def request() -> None:
        if time.monotonic() >= next_request[0]:
            next_request[0] += 0.5
            bench.send(lib, "short", "B", job, seconds)

    bench.wait(
        f"A's {seconds:g}s run to end (duplicates requested every 0.5 s)",
        lambda: bool(bench.of(job, "end", "A") or bench.of(job, "lost", "A")),
        seconds + 10,
        request,
    )
    a_end = (bench.of(job, "end", "A") + bench.of(job, "lost", "A"))[0]["t"]
    started = [e for e in bench.of(job, "start") if e["t"] < a_end]
    spans = [span for span in _spans(bench, job) if span[0] < a_end]
    return {
        "executions started during the run": len(started),
        "most executions running at once": _max_running(spans),
    }


def pause(bench: Bench, lib: str) -> dict[str, Any]:
    """SIGSTOP the holder past the lifetime; B takes over; A resumes and ends while B runs."""
    job = f"pause-{uuid.uuid4().hex[:6]}"
    a = bench.workers["A"]
    assert a.child is not None
    a_runs, b_runs = 0.6, 0.75 * bench.lock  # B's run ends before even a publish-time lock lapses
    bench.send(lib, "short", "A", job, a_runs)
    bench.wait("A's first step", lambda: bool(bench.of(job, "step", "A")), 15)
    paused = time.time()
    a.child.pause()
    key = bench.key(lib, "short", job, a_runs)
    next_request = [0.0]
    values: list[tuple[float, Any]] = []  # (time, value of the lock key) whenever it changes

    def request() -> None:
        value = bench.client.get(key)
        if not values or values[-1][1] != value:
            values.append((time.time(), value))
        if time.monotonic() >= next_request[0]:
            next_request[0] = time.monotonic() + 0.25
            bench.send(lib, "short", "B", job, b_runs)

    try:
        bench.wait(
            f"A paused (SIGSTOP) for {1.25 * bench.lock:g}s",
            lambda: time.time() - paused >= 1.25 * bench.lock,
            1.25 * bench.lock + 5,
            request,
        )
    finally:
        a.child.resume()
    resumed = time.time()
    b_started = bool(bench.of(job, "start", "B"))
    bench.wait(
        "A resumed; B's run to end",
        lambda: bool(bench.of(job, "end", "B")),
        3 * bench.lock + 5,
        request,
    )
    b_start, b_end = bench.of(job, "start", "B")[0], bench.of(job, "end", "B")[0]
    a_done = (bench.of(job, "end", "A") + bench.of(job, "lost", "A"))[0]
    a_steps_after = [e for e in bench.of(job, "step", "A") if e["t"] >= resumed]
    third = [e for e in bench.of(job, "start", "B")[1:] if b_start["t"] < e["t"] < b_end["t"]]
    # B's lock: the value the key held when B started; did it vanish right after A ended?
    held = [v for t, v in values if t <= b_start["t"] + 0.1]
    b_value = held[-1] if held else None
    changed = [t for t, v in values if t > b_start["t"] and v != b_value]
    deleted = bool(
        b_value is not None
        and changed
        and a_done["t"] <= changed[0] < b_end["t"]
        and changed[0] - a_done["t"] < 0.3
    )
    return {
        "B took over during the pause": b_started,
        "A told it lost the claim": bool(bench.of(job, "lost", "A")),
        "steps A ran after resuming": len(a_steps_after),
        "A ran on after resuming (s)": round(max(a_done["t"] - resumed, 0.0), 3),
        "A's release deleted B's lock": deleted,
        "third execution started while B ran": len(third),
        "most executions running at once": _max_running(
            _spans(bench, job, {"A": (paused, resumed)})
        ),
    }


SCENES: dict[str, Callable[[Bench, str], dict[str, Any]]] = {
    "crash": crash,
    "slow": slow,
    "pause": pause,
}


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; prints a Markdown table per scene. Returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m example_project compare")
    parser.add_argument("--redis-url", default=None, help="a Redis to use (default: embedded)")
    parser.add_argument(
        "--lock",
        type=float,
        default=2.0,
        help="the lifetime given to all three libraries, float seconds",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--scene",
        choices=("crash", "slow", "pause"),
        action="append",
        help="run only this scene (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        import celery_once  # noqa: F401
        import celery_singleton  # noqa: F401
    except ImportError:
        sys.stdout.write("needs: pip install celery-once celery-singleton\n")
        return 2
    processes = Processes()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    bench: Bench | None = None
    runs = [
        (scene, lib) for scene in SCENES if not args.scene or scene in args.scene for lib in LIBS
    ]
    try:
        url = args.redis_url or EmbeddedRedis(processes).start()
        prefix = f"lease-cmp-{os.getpid()}:"
        bench = Bench(url, prefix, args.lock, processes)
        bench.say(
            f"Redis: {url}; every key of this run is under {prefix} or is a celery-once "
            f"lock of its jobs (deleted at the end)"
        )
        for number, (scene, lib) in enumerate(runs, 1):
            bench.say(f"== [{number}/{len(runs)}] {scene}: {lib}")
            bench.restart()
            figures = SCENES[scene](bench, lib)
            bench.say(f"   {figures}")
            results.setdefault(scene, {})[lib] = figures
    except KeyboardInterrupt:
        return 130
    finally:
        processes.close()  # first: a worker still running could write keys again
        if bench is not None and args.redis_url:  # an embedded Redis is gone with its data
            try:
                bench.say(f"deleted the {bench.delete_keys()} keys this run wrote")
            except Exception as exc:  # clean-up must never hide the results
                bench.say(f"could not delete this run's keys ({bench.prefix}*): {exc!r}")
    for scene, by_lib in results.items():
        names = list(next(iter(by_lib.values())))
        sys.stdout.write(
            f"\n### {scene} (lifetime {args.lock:g} s)\n\n| |"
            + "|".join(f" {lib} " for lib in by_lib)
            + "|\n|---|"
            + "---|" * len(by_lib)
            + "\n"
        )
        for name in names:
            sys.stdout.write(
                f"| {name} |" + "|".join(f" {by_lib[lib][name]} " for lib in by_lib) + "|\n"
            )
    if args.json is not None:
        args.json.write_text(json.dumps({"lock_s": args.lock, "results": results}, indent=2))
    return 0
