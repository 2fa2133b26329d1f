"""``celery lease`` as the docs show it: the sample ``ls`` tables are what the command prints,
and every exit code docs/operations/cli.md lists is the one the command returns.

The exit codes are checked in this process with Click's runner (the command as ``celery``
runs it, without a subprocess per case); the leases are real, in the private Redis.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result

from celery_lease import LeasedTask, hold
from celery_lease.ops.cli import lease
from tests.support.waiting import wait_for
from tests.test_cli import celery_lease
from tests.test_docs_snippets import ALL, LISTING, REPO

OPERATIONS = REPO / "docs" / "operations" / "cli.md"
_CELLS = re.compile(r"\S+(?: \S+)*")  # a cell: words separated by single spaces


def _cells(line: str) -> list[str]:
    return _CELLS.findall(line)


def _ls_tables() -> list[tuple[str, list[str]]]:
    """(where, lines) of every sample ``celery lease ls`` table in the docs."""
    return [
        (s.where, s.code.splitlines())
        for s in ALL
        if s.lang in LISTING and s.code.startswith("TASK ") and "TIME LEFT" in s.code
    ]


def test_the_docs_ls_tables_are_what_ls_prints(redis_url: str) -> None:
    tables = _ls_tables()
    assert {where.split(":")[0] for where, _ in tables} >= {
        "docs/operations/cli.md",
        "docs/howto/hold.md",
    }
    env = {"TEST_BROKER_URL": redis_url}
    with (
        hold("invoice:42", ttl=30.0, url=redis_url),
        hold("nightly-report", ttl=30.0, url=redis_url),
    ):
        printed = celery_lease({**env, "COLUMNS": "200"}, "ls")
        wide = celery_lease(env, "ls", "--wide")
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    headers = (_cells(lines[0]), _cells(wide.stdout.splitlines()[0]))
    for where, table in tables:
        header, rows, count = _cells(table[0]), table[1:-1], table[-1]
        assert header in headers, f"{where}: columns {header}, the command prints {headers}"
        assert count == f"{len(rows)} lease(s)", where
        for row in rows:
            cell = dict(zip(header, _cells(row), strict=True))
            assert cell["PID"].isdigit() and re.fullmatch(r"\d+\.\ds", cell["TIME LEFT"]), where
            assert cell["KEY"].startswith("lease:{"), where
            if "~" not in cell["KEY"]:
                owner = "hold" if cell["TASK"] == "celery_lease.hold" else cell["TASK"]
                assert cell["KEY"].startswith(f"lease:{{{owner}:"), where

    # The how-to's table is these two holds: the columns that do not vary are as printed.
    (hold_table,) = [t for where, t in tables if where.startswith("docs/howto/hold.md")]

    def fixed(table: list[str]) -> list[tuple[str, ...]]:
        keep = ("TASK", "TASK ID", "KEY")
        header = _cells(table[0])
        return [
            tuple(dict(zip(header, _cells(r), strict=True))[k] for k in keep) for r in table[1:-1]
        ]

    assert _cells(hold_table[0]) == _cells(lines[0])
    assert fixed(hold_table) == fixed(lines)
    assert hold_table[-1] == lines[-1]


# -- exit codes -------------------------------------------------------------------------------


def _listed_exit_codes() -> dict[int, list[str]]:
    """docs/operations/cli.md's exit-code table: code -> its clauses (split at ``;``)."""
    text = OPERATIONS.read_text().split("## Exit codes", 1)[1]
    rows = re.findall(r"^\| (\d) \| (.+) \|$", text, re.M)
    assert rows, "docs/operations/cli.md has no exit-code table"
    return {int(code): [c.strip() for c in clauses.split(";")] for code, clauses in rows}


class Store(SimpleNamespace):
    url: str
    client: redis.Redis
    app: Celery


def _app(url: str, **conf: Any) -> Celery:
    app = Celery("docs_cli", broker=url, backend=url, set_as_current=False)
    app.conf.update(lease_backend=url, **conf)

    @app.task(base=LeasedTask, shared=False, name="docs.sync", lease_key=("account_id",))
    def sync(account_id: int, until: threading.Event | None = None) -> None:
        if until is not None:
            until.wait(30)

    @app.task(shared=False, name="docs.plain")
    def plain() -> None:
        """Not leased."""

    return app


def _run(app: Celery, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(lease, list(args), obj=SimpleNamespace(app=app), input=input)


@pytest.fixture
def setup(redis_url: str) -> Iterator[Store]:
    yield Store(url=redis_url, client=redis.Redis.from_url(redis_url), app=_app(redis_url))


def _with_running_sync(s: Store, *args: str) -> Result:
    """``args`` run while an execution of ``docs.sync(7)`` holds its lease (eagerly, in a
    thread of this process)."""
    task = s.app.tasks["docs.sync"]
    until = threading.Event()
    runner = threading.Thread(target=task.apply, args=((7,), {"until": until}))
    runner.start()
    try:
        key = task.lease_key_for((7,))
        wait_for(lambda: s.client.exists(key), 10, message=f"nothing took {key}")
        return _run(s.app, *args)
    finally:
        until.set()
        runner.join(30)


def _holding(name: str, *args: str, input: str | None = None) -> Callable[[Store], Result]:
    def case(s: Store) -> Result:
        with hold(name, ttl=30.0, url=s.url):
            return _run(s.app, *args, input=input)

    return case


def _foreign(*args: str) -> Callable[[Store], Result]:
    def case(s: Store) -> Result:
        s.client.set("lease:{not-ours}", "written by another tool", ex=60)
        return _run(s.app, *args)

    return case


#: Each clause of the table -> (exit code, the case that shows it). ``None``: checked by the
#: named test elsewhere (it needs a prompt answered mid-change, or a Redis Cluster).
CASES: dict[str, tuple[int, Callable[[Store], Result] | str]] = {
    "success": (0, lambda s: _with_running_sync(s, "show", "docs.sync", "7")),
    "`ls` that finds nothing held": (0, lambda s: _run(s.app, "ls")),
    "`doctor` with warnings only (without `--strict`)": (0, _foreign("doctor")),
    "`doctor`: a check failed": (1, lambda s: _run(_app(s.url, lease_min_replicas=1), "doctor")),
    "`doctor --strict`: a check warned": (1, _foreign("doctor", "--strict")),
    "`release`: refused (the lease changed since it was shown)": (
        1,
        "tests/test_cli.py::test_release_refuses_when_the_lease_changed_after_it_was_shown",
    ),
    "`release`: declined at the prompt": (
        1,
        _holding("x", "release", "lease:{hold:x}", input="n\n"),
    ),
    "`release`: no lease at the key": (1, lambda s: _run(s.app, "release", "lease:{hold:x}")),
    "`release`: a key celery-lease did not write": (
        1,
        _foreign("release", "lease:{not-ours}", "--yes"),
    ),
    "`show`: the key is free": (1, lambda s: _run(s.app, "show", "docs.sync", "7")),
    "`ls`: a cluster node did not answer (the list is incomplete)": (
        1,
        "tests/test_cluster.py::test_a_dead_primary_costs_only_its_own_leases",
    ),
    "an unknown option or a missing argument": (2, lambda s: _run(s.app, "show")),
    "`ls --task` or `show` with a name no registered task has": (
        2,
        lambda s: _run(s.app, "ls", "--task", "docs.nope"),
    ),
    "`show` of a task that is not a `LeasedTask`": (2, lambda s: _run(s.app, "show", "docs.plain")),
    "`show --kwargs` that is not a JSON object": (
        2,
        lambda s: _run(s.app, "show", "docs.sync", "--kwargs", "[7]"),
    ),
    "`release` of an internal key (`…:fence`, `…:wake`, `…:last-run`)": (
        2,
        lambda s: _run(s.app, "release", "lease:{hold:x}:fence"),
    ),
    "a configuration error (an invalid `lease_*` setting)": (
        2,
        lambda s: _run(
            Celery("bad", broker=s.url, set_as_current=False, config_source={"lease_ttl": -1.0}),
            "ls",
        ),
    ),
}


def test_the_exit_code_table_lists_exactly_the_cases_checked() -> None:
    listed = {
        (code, clause) for code, clauses in _listed_exit_codes().items() for clause in clauses
    }
    assert listed == {(code, clause) for clause, (code, _) in CASES.items()}


@pytest.mark.parametrize("clause", list(CASES), ids=lambda c: re.sub(r"\W+", "-", c)[:60])
def test_each_listed_exit_code_is_what_the_command_returns(clause: str, setup: Store) -> None:
    code, case = CASES[clause]
    if isinstance(case, str):  # elsewhere: that test asserts the exit code
        path, name = case.split("::")
        source = (REPO / path).read_text()
        assert re.search(rf"def {name}\w*\(", source), case
        assert "returncode == 1" in source or "exit_code == 1" in source
        return
    result = case(setup)
    assert result.exit_code == code, (clause, result.output, result.exception)


def test_show_prints_the_key_of_a_free_call_before_exiting_1(setup: Store) -> None:
    key = setup.app.tasks["docs.sync"].lease_key_for((7,))
    result = _run(setup.app, "show", "docs.sync", "7", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"key": key, "holder": None}


def test_doctor_says_acks_late_and_the_missing_time_limit_in_words(redis_url: str) -> None:
    app = _app(redis_url, task_acks_late=True)
    result = _run(app, "doctor")
    line = next(x for x in result.output.splitlines() if "acks_late" in x)
    assert (
        "acks_late is on with no time_limit: a run longer than visibility_timeout=3600s is "
        "delivered again while it still runs" in line
    ), line
    limited = _run(_app(redis_url, task_acks_late=True, task_time_limit=7200), "doctor")
    assert (
        "acks_late is on with time_limit=7200s, not below visibility_timeout: a run "
        "longer than" in limited.output
    ), limited.output
