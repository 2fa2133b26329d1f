"""One scene's timeline: worker events, measured store state and orchestrator actions as rows.

The table has the shape of the design note's: time, worker A, the key in the store, worker B.
Rows are printed as things happen; when nothing happens for a second a row with the store's
current state is printed, so a waiting demo is never silent and the lease's remaining lifetime
(and its renewals) can be watched counting down and jumping back up.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import redis

from celery_lease.store import parse_value

from .runtime import Worker

WIDTHS = (8, 30, 31, 30)  # time, worker A, the key in the store, worker B (characters)
TICK = 1.0  # float seconds without output before a state row is printed
POLL = 0.05  # float seconds between two looks at the events and the store
#: Float seconds a conflict row waits for the row of the claim it names. Workers push their
#: events independently, so the duplicate's "skipped: A holds it" can reach the list before
#: A's "claims the lease"; it is held back (with every later row) until that claim is seen.
HOLD = 2.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lost_text(event: dict[str, Any]) -> str:
    """A LeaseLost: its cause, and how late it came (float seconds)."""
    late = float(event.get("late") or 0)
    if event.get("cause") == "deadline":
        return f"LeaseLost: its deadline passed {late:.2f}s ago"
    return f"LeaseLost ({event.get('cause')}, {late:.2f}s after the last renewal)"


def _stopped_text(event: dict[str, Any]) -> str:
    """A body that stopped on its loss: the steps done, and whether its checkpoint landed."""
    saved = "saved" if event.get("checkpoint_accepted") else "REFUSED by the fencing guard"
    return f"stops after step {event.get('done')}; checkpoint write {saved}"


def _released_text(event: dict[str, Any]) -> str:
    """A release: the key freed, or left alone (another token holds it now)."""
    if event.get("released"):
        return "releases the lease"
    return "release finds another token: leaves the key alone"


@dataclass
class Sample:
    """One look at the lease key: ``t`` (wall-clock seconds), holder letter, fence, seconds left.

    ``letter`` is ``None`` when the key was absent.
    """

    t: float
    letter: str | None
    fence: int | None
    remaining: float | None
    pid: int = 0


@dataclass
class Stage:
    """The printer and bookkeeper of one scene.

    Args:
        out: where to print.
        client: Redis client for the event list and the lease key.
        events_key: the Redis list the workers append events to.
        workers: ``{"A": Worker, "B": Worker}``.
        lease_key: the lease key of this scene's job (events for other keys are ignored).
    """

    out: TextIO
    client: redis.Redis
    events_key: str
    workers: dict[str, Worker]
    lease_key: str
    origin: float = field(default_factory=time.time)
    events: list[dict[str, Any]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    renewals: dict[int, int] = field(default_factory=dict)  # fence -> renewals seen
    status: dict[str, str] = field(default_factory=lambda: {"A": "", "B": ""})
    _index: int = 0
    _pending: list[dict[str, Any]] = field(default_factory=list)  # read, not printed yet
    _claimed: set[int] = field(default_factory=set)  # fences whose claim row is printed
    _fences: dict[int, str] = field(default_factory=dict)
    _pids: dict[int, str] = field(default_factory=dict)
    _last_output: float = 0.0
    _last_state: tuple[str | None, int | None] = (None, None)

    def __post_init__(self) -> None:
        self._index = int(self.client.llen(self.events_key))  # earlier scenes' events: not ours
        self.header()

    # -- formatting ---------------------------------------------------------------------------

    def clock(self, t: float) -> str:
        """``m:ss.s`` since the scene started."""
        elapsed = max(t - self.origin, 0.0)
        return f"{int(elapsed // 60)}:{elapsed % 60:04.1f}"

    def fence(self, value: int | None) -> str:
        """A short name for a fencing token: ``#1``, ``#2``... in order of appearance."""
        if value is None:
            return "?"
        if value not in self._fences:
            self._fences[value] = f"#{len(self._fences) + 1}"
        return self._fences[value]

    def letter_of(self, pid: int) -> str:
        """Which worker a pid belongs to (``"?"`` if unknown)."""
        if pid in self._pids:
            return self._pids[pid]
        for letter, worker in self.workers.items():
            if worker.owns(pid):
                self._pids[pid] = letter
                return letter
        return "?"

    def _print_row(self, cells: tuple[str, str, str, str]) -> None:
        wrapped = [textwrap.wrap(c, w) or [""] for c, w in zip(cells, WIDTHS, strict=True)]
        height = max(len(w) for w in wrapped)
        for i in range(height):
            parts = [
                (w[i] if i < len(w) else "").ljust(width)
                for w, width in zip(wrapped, WIDTHS, strict=True)
            ]
            self.out.write("| " + " | ".join(parts) + " |\n")
        self.out.flush()
        self._last_output = time.monotonic()

    def header(self) -> None:
        """Print the table header."""
        self._print_row(("time", "worker A", "the key in the store", "worker B"))
        self.out.write("|" + "|".join("-" * (w + 2) for w in WIDTHS) + "|\n")

    def row(self, t: float, letter: str | None, text: str, store: str | None = None) -> None:
        """Print ``text`` in worker ``letter``'s column (or none) at time ``t``."""
        cells = ["", "", store if store is not None else self.store_text(), ""]
        if letter == "A":
            cells[1] = text
        elif letter == "B":
            cells[3] = text
        self._print_row((self.clock(t), cells[1], cells[2], cells[3]))

    def action(self, letter: str, text: str, status: str | None = None) -> float:
        """Print something the orchestrator does to worker ``letter``; returns its time."""
        now = time.time()
        if status is not None:
            self.status[letter] = status
        self.row(now, letter, text)
        return now

    def note(self, text: str) -> None:
        """Print a line of commentary under the table."""
        self.out.write(f"  > {text}\n")
        self.out.flush()
        self._last_output = time.monotonic()

    # -- the store ----------------------------------------------------------------------------

    def sample(self) -> Sample:
        """Look at the lease key now (value and remaining lifetime in one round trip)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.get(self.lease_key)
        pipe.pttl(self.lease_key)
        value, pttl = pipe.execute()
        now = time.time()
        if value is None:
            found = Sample(now, None, None, None)
        else:
            holder = parse_value(value)
            found = Sample(
                now,
                self.letter_of(holder.pid),
                holder.fencing_token,
                max(int(pttl), 0) / 1000,
                holder.pid,
            )
        previous = self.samples[-1] if self.samples else None
        if (
            previous is not None
            and found.fence is not None
            and previous.fence == found.fence
            and previous.remaining is not None
            and found.remaining is not None
            and found.remaining > previous.remaining + 0.02
        ):
            self.renewals[found.fence] = self.renewals.get(found.fence, 0) + 1
        self.samples.append(found)
        return found

    def store_text(self, found: Sample | None = None) -> str:
        """The "key in the store" cell for a sample (default: the latest)."""
        found = found or (self.samples[-1] if self.samples else None)
        if found is None or found.letter is None:
            return "absent"
        text = f"{found.letter}'s claim {self.fence(found.fence)}, {found.remaining:.1f}s left"
        renewed = self.renewals.get(found.fence or 0, 0)
        if renewed:
            text += f", renewed x{renewed}"
        worker = self.workers.get(found.letter)
        if found.pid and not _alive(found.pid):
            text += " (holder dead)"
        elif worker is not None and worker.child is not None and worker.child.paused:
            text += " (holder paused)"
        return text

    # -- events -------------------------------------------------------------------------------

    def describe(self, event: dict[str, Any]) -> str:
        """The timeline text of a worker event ("" for a start, which shows as the status
        cell; the kind itself for a kind this table does not know)."""
        texts: dict[str, Callable[[dict[str, Any]], str]] = {
            "acquired": lambda e: f"claims the lease ({self.fence(e.get('fence'))}), starts",
            "conflict": self._conflict_text,
            "write": self._write_text,
            "lost": _lost_text,
            "stopped": _stopped_text,
            "end": lambda e: f"finishes ({e.get('done')} steps)",
            "released": _released_text,
            "start": lambda e: "",
        }
        kind = event["ev"]
        return texts[kind](event) if kind in texts else str(kind)

    def _conflict_text(self, event: dict[str, Any]) -> str:
        """A duplicate that found the key held: who holds it, for how long (float seconds),
        and what its policy does about it."""
        holder = str(event.get("holder", ""))
        pid = int(holder.rsplit(":", 1)[-1]) if holder.rsplit(":", 1)[-1].isdigit() else 0
        who = self.letter_of(pid) if pid else "?"
        left = float(event.get("remaining") or 0.0)
        policy = event.get("policy")
        if policy == "retry":
            return f"{who} holds it ({left:.1f}s left): retry in {left:.1f}s"
        if policy == "skip":
            return f"duplicate skipped: {who} holds it ({left:.1f}s left)"
        return f"conflict ({policy}): {who} holds it"

    def _write_text(self, event: dict[str, Any]) -> str:
        """A step's write: accepted, or refused by the fencing guard (an older fence)."""
        if event.get("accepted"):
            return f"step {event.get('step')} written ({self.fence(event.get('fence'))})"
        return (
            f"late write of step {event.get('step')} REFUSED by the fencing guard "
            f"({self.fence(event.get('fence'))} < newest)"
        )

    def pump(self) -> None:
        """Read new events, look at the store, and print whatever changed."""
        raw = self.client.lrange(self.events_key, self._index, -1)
        self._index += len(raw)
        fresh = []
        for item in raw:
            event = json.loads(item)
            if event.get("pid") and event.get("w") in ("A", "B"):
                self._pids.setdefault(int(event["pid"]), event["w"])
            if event.get("key") == self.lease_key:
                fresh.append(event)
        self.events.extend(fresh)
        self.events.sort(key=lambda e: float(e["t"]))
        found = self.sample()
        shown = self._release(fresh)
        for event in shown:
            letter = event.get("w")
            if event["ev"] == "start":
                self.status[letter] = "working"
            elif event["ev"] in ("end", "stopped"):
                self.status[letter] = ""
            text = self.describe(event)
            if text:
                self.row(float(event["t"]), letter, text)
        state = (found.letter, found.fence)
        if state != self._last_state:
            self._last_state = state
            if not shown:
                self.row(found.t, None, "")
        elif time.monotonic() - self._last_output >= TICK:
            cells = {k: f"({v})" if v else "" for k, v in self.status.items()}
            self._print_row((self.clock(found.t), cells["A"], self.store_text(found), cells["B"]))

    def _release(self, fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events to print now, in time order: a conflict waits (up to :data:`HOLD`) for
        the claim of the holder it names, and every later event waits with it."""
        self._pending.extend(fresh)
        self._pending.sort(key=lambda e: float(e["t"]))
        shown: list[dict[str, Any]] = []
        while self._pending:
            event = self._pending[0]
            holder = event.get("holder_fence")
            if (
                event["ev"] == "conflict"
                and holder is not None
                and holder not in self._claimed
                and time.time() - float(event["t"]) < HOLD
            ):
                break
            self._pending.pop(0)
            if event["ev"] == "acquired" and event.get("fence") is not None:
                self._claimed.add(int(event["fence"]))
            shown.append(event)
        return shown

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Pump until ``predicate()`` is true or ``timeout`` float seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            self.pump()
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL)

    # -- queries ------------------------------------------------------------------------------

    def find(
        self,
        kind: str,
        letter: str | None = None,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """This scene's events of ``kind`` (from worker ``letter``), in time order."""
        return [
            e
            for e in self.events
            if e["ev"] == kind
            and (letter is None or e.get("w") == letter)
            and (where is None or where(e))
        ]

    def first(
        self,
        kind: str,
        letter: str | None = None,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any] | None:
        """The first matching event, or ``None``."""
        found = self.find(kind, letter, where)
        return found[0] if found else None

    def since(self, t: float) -> float:
        """Seconds from scene start to wall-clock time ``t``."""
        return t - self.origin
