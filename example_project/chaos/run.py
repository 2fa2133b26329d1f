"""``python -m example_project chaos``: run a fault campaign, check it, print the summary.

Exit status: 0 when the checker found no violation, 1 when it found any, 2 for bad usage.
``--check FILE`` re-checks a history saved with ``--history`` without running anything.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from .checker import check, summarize
from .history import History

__all__ = ["main", "report"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m example_project chaos",
        description="Random faults against real workers for a while; then a checker reads the "
        "whole history of fenced writes and proves the lease's promises held.",
    )
    parser.add_argument(
        "--duration", type=float, default=120.0, help="seconds of faults (default 120)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=3,
        help="workers, pools in turn: prefork, threads, gevent (default 3)",
    )
    parser.add_argument("--keys", type=int, default=20, help="distinct job keys (default 20)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the producer and nemesis")
    parser.add_argument("--ttl", type=float, default=3.0, help="lease TTL, seconds (default 3)")
    parser.add_argument("--rate", type=float, default=3.0, help="jobs per second (default 3)")
    parser.add_argument(
        "--beats",
        type=int,
        default=2,
        help="celery beat processes with the leader lease, sending the job for "
        "three keys every 3 s (default 2; 0: no beat)",
    )
    parser.add_argument(
        "--sentinel",
        action="store_true",
        help="run the lease store as a Sentinel set-up (one primary, one "
        "replica, three sentinels) and inject failovers",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="broker and result backend (never faulted; default: a private "
        "redis-server). The lease store is always a private server: the "
        "campaign pauses, black-holes and empties it",
    )
    parser.add_argument(
        "--cooldown",
        type=float,
        default=0.0,
        help="the job's lease_cooldown, seconds (default 0: none); the checker "
        "then proves no execution starts within it after a success",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=0,
        help="also send a job with lease_limit=N on keys of its own (default "
        "0: none); the checker then proves never more than N ran at once",
    )
    parser.add_argument(
        "--debounce-min-replicas",
        type=int,
        default=0,
        help="the debounce job's lease_min_replicas (with --sentinel: 1 makes "
        "every debounce decision wait for the replica)",
    )
    parser.add_argument(
        "--dedupe-min-replicas",
        type=int,
        default=0,
        help="the dedupe job's lease_min_replicas (with --sentinel: 1 makes "
        "every dedupe decision at publish wait for the replica)",
    )
    parser.add_argument("--json", type=Path, help="write violations and counts here")
    parser.add_argument("--history", type=Path, help="save the whole recorded history here")
    parser.add_argument("--check", type=Path, help="re-check a saved history; run nothing")
    return parser


def report(
    history: History, json_path: Path | None = None, out: Any = sys.stdout
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Check ``history``, print each violation and the summary, write the JSON; return both."""
    violations = check(history)
    counts = summarize(history, violations)
    for v in violations:
        out.write(f"VIOLATION (property {v.property}, {v.rule}): {v.message}\n")
        out.write(f"  evidence: {json.dumps(v.evidence, sort_keys=True, default=str)}\n")
    out.write("summary:\n")
    for name, value in counts.items():
        out.write(f"  {name}: {value}\n")
    out.write(f"{'FAILED' if violations else 'OK'}: {len(violations)} violation(s)\n")
    found = [v.to_dict() for v in violations]
    if json_path is not None:
        json_path.write_text(
            json.dumps({"violations": found, "counts": counts}, indent=2, default=str) + "\n"
        )
    return found, counts


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_cleanly_on_signals() -> None:
    """Let SIGTERM and SIGINT (even when started in the background, where SIGINT is ignored)
    unwind the campaign, so its workers, servers and database are cleaned up."""
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)


def main(argv: list[str] | None = None) -> int:
    """Run (or re-check) a campaign; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.check is not None:
        history = History.from_dict(json.loads(args.check.read_text()))
    else:
        if args.workers < 1 or args.keys < 1 or args.duration <= 0 or args.rate <= 0:
            sys.stderr.write("--workers, --keys, --duration and --rate must be positive\n")
            return 2
        if args.beats < 0 or args.cooldown < 0 or args.limit < 0:
            sys.stderr.write("--beats, --cooldown and --limit must be 0 or more\n")
            return 2
        if args.limit and args.cooldown:
            sys.stderr.write(
                "--limit and --cooldown cannot go together (lease_limit refuses lease_cooldown)\n"
            )
            return 2
        from .campaign import Settings, run_campaign

        _stop_cleanly_on_signals()
        history = run_campaign(
            Settings(
                duration=args.duration,
                workers=args.workers,
                keys=args.keys,
                seed=args.seed,
                ttl=args.ttl,
                rate=args.rate,
                broker_url=args.redis_url,
                beats=args.beats,
                sentinel=args.sentinel,
                cooldown=args.cooldown,
                limit=args.limit,
                debounce_min_replicas=args.debounce_min_replicas,
                dedupe_min_replicas=args.dedupe_min_replicas,
            )
        )
        if args.history is not None:
            args.history.write_text(json.dumps(history.to_dict(), default=str) + "\n")
    violations, _ = report(history, args.json)
    return 1 if violations else 0
