"""Every code snippet in README.md and docs/**/*.md runs, against the system it names.

New pages are picked up by the glob; a snippet that stops working fails with its file and line.

How snippets are run (the convention for whoever writes docs)
-------------------------------------------------------------

A fenced block's info string says what it is:

- ``python``: the page's Python blocks run in order, in one fresh interpreter per page, as one
  module whose namespace starts with ``app`` (``Celery("proj")`` whose broker, results and
  lease store are a private Redis) and ``LeasedTask``; every other name a block uses at top
  level must be imported or defined on the page. Function bodies run only if the page calls
  them, so show the call (``assert write(...)``) where the behaviour matters. A block whose
  first line is ``# <name>.py`` is also written to the working directory as that file, so a
  shell block of the page can use it (``--conf=flowerconfig.py``).
- ``sql``: run statement by statement (split at ``;``) in a fresh database of each engine the
  marker names, with the named parameters (``:name``) the marker gives::

      <!-- run: sqlite postgresql name=account:42 value=page fence=1796008513651512 -->

  ``postgresql`` is a private database created on localhost:5432 and dropped afterwards.
- ``console`` / ``shell`` / ``bash`` / ``sh``: each command (the lines after a ``$ `` prompt
  when there are prompts; else every line that is not a ``#`` comment) runs with bash in a
  scratch directory holding a ``proj`` package (the app above, with a leased task
  ``proj.sync(account_id, full=False)``), the worktree's virtualenv first on ``PATH``. It
  must exit 0. A command that runs until stopped (a worker, beat, Flower) needs
  ``<!-- run: until "TEXT" -->``: it is started, must print TEXT, and is stopped with
  SIGTERM when the block is done.
- ``text``: output or a listing; not run.
- any block with ``title="<path>"`` (``python title="proj/tasks.py"``, ``toml
  title="pyproject.toml"``): a file of a project that the page builds up; not run here, because
  the page's own test writes every titled block to a directory and runs that project
  (tests/test_testing_plugin.py, tests/test_django_settings.py, tests/test_migrating.py).

Everywhere, ``localhost:6379`` means the private Redis server (the shared one on 6379 is never
touched). The marker is an HTML comment on the line just before the fence (invisible on the
site). A snippet that cannot run says why, and nothing else is needed::

    <!-- run: skip installs packages -->

Keep skips for what really cannot run here (``pip install``, ``bash scripts/test`` itself,
commands that write outside the project); everything else runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.redis_server import free_port
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

PYTHON = {"python", "py"}
SQL = {"sql"}
SHELL = {"console", "shell", "bash", "sh"}
LISTING = {"text"}
ENGINES = {"sqlite", "postgresql"}

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)(.*)$")
_TITLE = re.compile(r'\btitle="([^"]+)"')
_MARKER = re.compile(r"^\s*<!--\s*run:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Snippet:
    """One fenced block: ``line`` is the markdown line of its first line of code."""

    path: Path
    line: int
    lang: str
    code: str
    marker: str | None
    title: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker is not None and self.marker.split()[:1] == ["skip"]:
            return self.marker[4:].strip()
        return None


def extract(path: Path) -> list[Snippet]:
    """The fenced blocks of a markdown file, each with the ``run:`` marker before it."""
    lines = path.read_text().splitlines()
    snippets: list[Snippet] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang, info = opening.groups()
        title = _TITLE.search(info)
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(previous)
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        start = i - len(body) + 1  # 1-based line of the first line of code
        snippets.append(
            Snippet(
                path,
                start,
                lang.lower(),
                "\n".join(body) + "\n",
                marker.group(1) if marker else None,
                title.group(1) if title else None,
            )
        )
        i += 1
    return snippets


ALL = [s for path in DOC_FILES for s in extract(path)]
RUN = [s for s in ALL if s.skip_reason is None and s.lang not in LISTING and s.title is None]


def _problem(s: Snippet) -> str | None:
    """Why ``s`` cannot be run as written, or ``None``."""
    if s.skip_reason is not None:
        return None if s.skip_reason else "`run: skip` needs a reason"
    if s.title is not None:
        return None  # run by the page's own test, with the project's other files
    if s.lang in LISTING or s.lang in PYTHON:
        return None
    if s.lang in SQL:
        return _sql_marker_problem(s.marker)
    if s.lang in SHELL:
        return _shell_marker_problem(s.marker)
    return (
        f"info string {s.lang!r} is not run: use python, sql, console, or text for "
        "output, or `<!-- run: skip REASON -->`"
    )


def _sql_marker_problem(marker: str | None) -> str | None:
    """Why a sql block's ``run:`` marker does not say where it runs (the engines of
    :data:`ENGINES`, then ``name=value`` settings), or ``None``."""
    engines = [w for w in (marker or "").split() if "=" not in w]
    if not engines or set(engines) - ENGINES:
        return f"a sql block needs `<!-- run: ENGINES name=value... -->` (ENGINES: {ENGINES})"
    return None


def _shell_marker_problem(marker: str | None) -> str | None:
    """Why a shell block's ``run:`` marker is not one it takes (none, or ``until "TEXT"``), or
    ``None``."""
    if marker and not marker.startswith("until "):
        return f'unknown marker {marker!r} for a shell block (`until "TEXT"` or skip)'
    return None


def test_every_snippet_says_how_it_runs() -> None:
    assert len(ALL) >= 30 and len(RUN) >= 15, "the extractor finds too few blocks"
    problems = [f"{s.where}: {p}" for s in ALL if (p := _problem(s))]
    assert not problems, "\n".join(problems)


def _local(code: str, redis_url: str) -> str:
    """The snippet with the shared Redis's address replaced by the private server's."""
    address = redis_url.split("//", 1)[1].split("/", 1)[0]
    return re.sub(r"(localhost|127\.0\.0\.1):6379\b", address, code)


PROJ = '''
from celery import Celery
from celery_lease import LeasedTask

URL = {url!r}
app = Celery("proj", broker=URL, backend=URL)
app.conf.lease_backend = URL
app.conf.broker_connection_retry_on_startup = True


@app.task(shared=False, base=LeasedTask, name="proj.sync", lease_key=("account_id",))
def sync(account_id, full=False):
    """The task the shell examples name."""
    return account_id
'''

RUNNER = """
import json, sys, traceback
from celery import Celery
from celery_lease import LeasedTask

url, blocks = json.load(sys.stdin)
app = Celery("proj", broker=url, backend=url)
app.conf.lease_backend = url
namespace = {"__name__": "docs_page", "app": app, "LeasedTask": LeasedTask}
for where, filename, line, code in blocks:
    try:
        exec(compile("\\n" * (line - 1) + code, filename, "exec"), namespace)
    except BaseException:
        print(f"{where}: the python block starting here failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def _write_named_files(page: Path, workdir: Path, redis_url: str) -> None:
    for s in extract(page):
        first = s.code.split("\n", 1)[0].strip()
        if s.lang in PYTHON and re.fullmatch(r"#\s*[\w.-]+\.py", first):
            (workdir / first.lstrip("# ").strip()).write_text(_local(s.code, redis_url))


@pytest.fixture
def workdir(tmp_path: Path, redis_url: str) -> Path:
    """A scratch directory with the ``proj`` package on the private Redis."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text(PROJ.format(url=redis_url))
    return tmp_path


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(workdir), str(REPO)])
    env["FLOWER_PORT"] = str(free_port())  # never Flower's default 5555 of a real deployment
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


PY_PAGES = sorted({s.path for s in RUN if s.lang in PYTHON})


@pytest.mark.parametrize("page", PY_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_python_snippets_of_the_page_run(page: Path, workdir: Path, redis_url: str) -> None:
    blocks = [
        (s.where, str(s.path.relative_to(REPO)), s.line, _local(s.code, redis_url))
        for s in RUN
        if s.path == page and s.lang in PYTHON
    ]
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps([redis_url, blocks]),
        capture_output=True,
        text=True,
        cwd=workdir,
        env=_env(workdir),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


# -- SQL ---------------------------------------------------------------------------------------


def _sql_case(s: Snippet) -> tuple[list[str], dict[str, object], list[tuple[int, str]]]:
    """Engines, parameters, and (markdown line, text) of each statement of a sql block."""
    words = shlex.split(s.marker or "")
    engines = [w for w in words if "=" not in w]
    params: dict[str, object] = {}
    for word in words:
        if "=" in word:
            name, value = word.split("=", 1)
            params[name] = int(value) if value.lstrip("-").isdigit() else value
    code = "\n".join("" if line.strip().startswith("--") else line for line in s.code.splitlines())
    statements, offset = [], 0
    for chunk in code.split(";"):
        if chunk.strip():
            lead = len(chunk) - len(chunk.lstrip())
            statements.append((s.line + code.count("\n", 0, offset + lead), chunk.strip()))
        offset += len(chunk) + 1
    return engines, params, statements


def _used(statement: str, params: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in params.items() if re.search(rf"(?<!:):{k}\b", statement)}


SQL_SNIPPETS = [s for s in RUN if s.lang in SQL]


@pytest.mark.parametrize("snippet", SQL_SNIPPETS, ids=lambda s: s.where)
def test_sql_snippet_runs_on_each_engine_it_names(
    snippet: Snippet, request: pytest.FixtureRequest
) -> None:
    engines, params, statements = _sql_case(snippet)
    for engine in engines:
        execute = _executor(engine, request)
        for line, statement in statements:
            try:
                execute(statement, _used(statement, params))
            except Exception as exc:
                where = f"{snippet.path.relative_to(REPO)}:{line}"
                pytest.fail(f"{where}: on {engine}: {type(exc).__name__}: {exc}\n{statement}")


def _executor(
    engine: str, request: pytest.FixtureRequest
) -> Callable[[str, dict[str, object]], object]:
    """A function running one statement with named parameters in a fresh ``engine`` database."""
    if engine == "sqlite":
        db = sqlite3.connect(":memory:", isolation_level=None)
        request.addfinalizer(db.close)
        return db.execute
    import psycopg

    pg = psycopg.connect(request.getfixturevalue("postgres_db").dsn, autocommit=True)
    request.addfinalizer(pg.close)

    def execute(statement: str, params: dict[str, object]) -> object:
        # psycopg spells a named parameter %(name)s; a literal % is doubled.
        return pg.execute(re.sub(r"(?<!:):(\w+)", r"%(\1)s", statement.replace("%", "%%")), params)

    return execute


# -- shell -------------------------------------------------------------------------------------


def commands(s: Snippet) -> list[str]:
    """The commands of a shell block (continuation lines joined)."""
    lines = s.code.replace("\\\n", " ").splitlines()
    if any(line.startswith("$ ") for line in lines):
        return [line[2:].strip() for line in lines if line.startswith("$ ")]
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


SHELL_SNIPPETS = [s for s in RUN if s.lang in SHELL]


@pytest.mark.parametrize("snippet", SHELL_SNIPPETS, ids=lambda s: s.where)
def test_shell_snippet_runs(snippet: Snippet, workdir: Path, redis_url: str) -> None:
    _write_named_files(snippet.path, workdir, redis_url)
    env = _env(workdir)
    until = shlex.split(snippet.marker)[1] if snippet.marker else None
    services: list[subprocess.Popen[bytes]] = []
    try:
        for n, command in enumerate(commands(snippet)):
            command = _local(command, redis_url)
            if until is None:
                proc = subprocess.run(
                    ["bash", "-c", command],
                    cwd=workdir,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert proc.returncode == 0, (
                    f"{snippet.where}: `{command}` exited {proc.returncode}\n"
                    f"{(proc.stdout + proc.stderr)[-3000:]}"
                )
                continue
            log = workdir / f"service-{n}.log"
            with log.open("wb") as out:
                service = subprocess.Popen(
                    ["bash", "-c", command],
                    cwd=workdir,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            services.append(service)

            def printed(
                service: subprocess.Popen[bytes] = service, log: Path = log, command: str = command
            ) -> bool:
                if service.poll() is not None:
                    raise AssertionError(
                        f"{snippet.where}: `{command}` exited "
                        f"{service.returncode}:\n{log.read_text()[-3000:]}"
                    )
                return until in log.read_text(errors="replace")

            wait_for(
                printed,
                60,
                interval=0.1,
                message=lambda log=log, command=command: (
                    f"{snippet.where}: `{command}` never printed {until!r}:\n"
                    f"{log.read_text()[-3000:]}"
                ),
            )
    finally:
        for service in services:
            _stop(service)


def _stop(service: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group; SIGKILL if it is still there 15 s later (how
    fast a server shuts down is not what the docs claim, so it is not asserted)."""
    if service.poll() is None:
        os.killpg(service.pid, signal.SIGTERM)
    try:
        service.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(service.pid, signal.SIGKILL)
        service.wait(timeout=10)


def test_extractor_reports_markdown_line_numbers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent("""\
        # Title

        <!-- run: skip installs packages -->
        ```console
        pip install x
        ```

        - item

            ```python
            x = 1
            ```
        """)
    )
    first, second = extract(page)
    assert (first.line, first.lang, first.skip_reason) == (5, "console", "installs packages")
    assert (second.line, second.lang, second.code, second.marker) == (11, "python", "x = 1\n", None)
