"""The built distribution, installed as a user installs it, outside the repository.

Builds the sdist and the wheel with ``python -m build``, installs the wheel into a fresh
virtualenv (no system or repository packages; pip's cache keeps it quick), and starts a real
``celery worker`` from that virtualenv running the README's quick start against a private
Redis: the worker must start (the base dependencies include kombu's Redis transport), run the
leased task, and skip a duplicate that starts while it runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.fixtures import RedisFactory

ROOT = Path(__file__).resolve().parent.parent

# The quick start leaves two names to the reader; these stand in for them.
PREAMBLE = '''\
import json
import os
import time


def fetch_pages(account_id, since):
    time.sleep(2.0)  # long enough for the duplicate to start while this run holds the lease
    return ["page-1", "page-2"]


class _Ledger:
    def write(self, account_id, page, fencing_token):
        with open(os.environ["LEDGER"], "a") as out:
            out.write(json.dumps([account_id, page, fencing_token]) + "\\n")


ledger = _Ledger()
'''

CLIENT = '''\
import json
import celery_lease
from quickstart import sync_account
from celery_lease import is_skipped

results = [r.get(timeout=60) for r in [sync_account.delay(42), sync_account.delay(42)]]
print(json.dumps({"skipped": [is_skipped(r) for r in results],
                  "installed_at": celery_lease.__file__}))
'''


def readme_quick_start() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    return out


def test_the_sdist_and_the_wheel_carry_the_license_and_the_sdist_no_test_suite(
    dists: Path,
) -> None:
    (sdist,) = dists.glob("celery_lease-*.tar.gz")
    (wheel,) = dists.glob("celery_lease-*.whl")
    with tarfile.open(sdist) as tar:
        names = [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]
    assert "LICENSE" in names and "celery_lease/testing.py" in names
    assert not [name for name in names if name.startswith("tests/")]
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert "License-Expression: MIT" in metadata
    assert "Classifier: Framework :: Celery" in metadata
    assert re.search(r"Requires-Dist: celery\[redis\]>=5\.3", metadata)


def test_a_worker_from_the_installed_wheel_runs_the_quick_start(
    dists: Path, tmp_path: Path, throwaway_redis: RedisFactory
) -> None:
    (wheel,) = dists.glob("celery_lease-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)  # no system site packages, nothing from the repository
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)

    server = throwaway_redis()
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    url = server.url(0).rsplit("/", 1)[0]  # redis://127.0.0.1:<port>
    (app_dir / "quickstart.py").write_text(
        PREAMBLE + readme_quick_start().replace("redis://localhost:6379", url))
    (app_dir / "client.py").write_text(CLIENT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}",
               LEDGER=str(tmp_path / "ledger.jsonl"))

    worker = subprocess.Popen(
        [str(env_dir / "bin" / "celery"), "-A", "quickstart", "worker", "--concurrency", "2",
         "--loglevel", "INFO", "--without-gossip", "--without-mingle", "-n", "wheel@%h"],
        cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = subprocess.run([str(python), "client.py"], cwd=app_dir, env=env,
                                capture_output=True, text=True, timeout=90)
    finally:
        worker.terminate()
        log, _ = worker.communicate(timeout=30)
    assert client.returncode == 0, client.stderr + log
    report = json.loads(client.stdout)
    assert str(env_dir) in report["installed_at"]
    assert sorted(report["skipped"]) == [False, True], log
    rows = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [row[:2] for row in rows] == [[42, "page-1"], [42, "page-2"]]
    assert rows[0][2] == rows[1][2] > 0  # one execution, one fencing token
    assert "ModuleNotFoundError" not in log
