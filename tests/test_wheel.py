"""The built distribution, installed as a user installs it, outside the repository.

Builds the sdist and the wheel with ``python -m build``, installs the wheel into a fresh
virtualenv (no system or repository packages; pip's cache keeps it quick), and starts a real
``celery worker`` from that virtualenv running the README's quick start against a private
Redis: the worker must start (the base dependencies include kombu's Redis transport), run the
leased task, and skip a duplicate that starts while it runs; the README's unit test runs with
the plugin of the installed ``testing`` extra; and the README, which is the long description,
links only to addresses that work outside the repository.
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

# The test's stand-in for the API client is slow, so that the duplicate starts while the
# first run holds the lease (the task looks `fetch_pages` up when it runs).
SLOW_FETCH = """

_fetch_pages = fetch_pages


def fetch_pages(account_id, since):
    import time

    time.sleep(2.0)
    return _fetch_pages(account_id, since)
"""

CLIENT = """\
import json
import celery_lease
from proj import sync_account
from celery_lease import is_skipped

results = [r.get(timeout=60) for r in [sync_account.delay(42), sync_account.delay(42)]]
print(json.dumps({"results": results, "skipped": [is_skipped(r) for r in results],
                  "installed_at": celery_lease.__file__}))
"""
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPOSITORY = "https://github.com/celery-lease/celery-lease"  # [project.urls] Source


def readme_block(title: str) -> str:
    """The README's code block titled ``title`` (the quick start's files)."""
    text = (ROOT / "README.md").read_text()
    found = re.search(rf'```python title="{re.escape(title)}"\n(.*?)```', text, re.S)
    assert found, f"README.md has no block titled {title}"
    return found.group(1)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def test_the_sdist_and_the_wheel_carry_the_license_and_the_sdist_no_test_suite(
    dists: Path,
) -> None:
    (sdist,) = dists.glob("celery_lease-*.tar.gz")
    (wheel,) = dists.glob("celery_lease-*.whl")
    with tarfile.open(sdist) as tar:
        names = [name.split("/", 1)[1] for name in tar.getnames() if "/" in name]
    assert "LICENSE" in names and "celery_lease/ops/testing.py" in names
    assert not [name for name in names if name.startswith("tests/")]
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    assert "License-Expression: MIT" in metadata
    assert "Classifier: Framework :: Celery" in metadata
    assert re.search(r"Requires-Dist: celery\[redis\]>=5\.3", metadata)


def test_every_link_of_the_long_description_works_outside_the_repository(
    dists: Path,
) -> None:
    # The README is the package's long description: on the index a relative link is broken,
    # so each link is absolute, and one into this repository names a file that exists.
    (wheel,) = dists.glob("celery_lease-*.whl")
    with zipfile.ZipFile(wheel) as whl:
        metadata = whl.read(
            next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        ).decode()
    description = metadata.split("\n\n", 1)[1]
    assert "## Quick start" in description
    links = LINK.findall(description)
    assert len(links) >= 10
    for link in links:
        assert link.startswith(("https://", "#")), f"relative link in the README: {link}"
        if link.startswith(REPOSITORY + "/"):
            path = re.sub(r"^/(blob|tree)/main/", "", link[len(REPOSITORY) :]).split("#")[0]
            assert (ROOT / path).exists(), f"README links to {path}, which does not exist"


def test_the_install_instructions_name_the_wheel_that_build_writes(dists: Path) -> None:
    (wheel,) = dists.glob("celery_lease-*.whl")
    for page in ("README.md", "docs/install.md"):
        named = set(re.findall(r"celery_lease-\S+?\.whl", (ROOT / page).read_text()))
        assert named == {wheel.name}, page


def test_a_worker_from_the_installed_wheel_runs_the_quick_start_and_its_unit_test(
    dists: Path, tmp_path: Path, throwaway_redis: RedisFactory
) -> None:
    (wheel,) = dists.glob("celery_lease-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)  # no system site packages, nothing from the repository
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"{wheel}[testing]"],
        check=True,
        capture_output=True,
        timeout=300,
    )

    server = throwaway_redis()
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    url = server.url(0).rsplit("/", 1)[0]  # redis://127.0.0.1:<port>
    quick_start = readme_block("proj.py").replace("redis://localhost:6379", url)
    (app_dir / "proj.py").write_text(quick_start)
    (app_dir / "test_proj.py").write_text(readme_block("test_proj.py"))
    (app_dir / "client.py").write_text(CLIENT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}")

    # The README's unit test, as written, with the installed plugin (an embedded Redis).
    unit = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_proj.py"],
        cwd=app_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unit.returncode == 0 and "1 passed" in unit.stdout, unit.stdout + unit.stderr

    (app_dir / "proj.py").write_text(quick_start + SLOW_FETCH)
    worker = subprocess.Popen(
        [
            str(env_dir / "bin" / "celery"),
            "-A",
            "proj",
            "worker",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "-n",
            "wheel@%h",
        ],
        cwd=app_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = subprocess.run(
            [str(python), "client.py"],
            cwd=app_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        worker.terminate()
        log, _ = worker.communicate(timeout=30)
    assert client.returncode == 0, client.stderr + log
    report = json.loads(client.stdout)
    assert str(env_dir) in report["installed_at"]
    assert sorted(report["skipped"]) == [False, True], log
    assert 3 in report["results"]  # the run that held the lease copied the three pages
    assert "ModuleNotFoundError" not in log
