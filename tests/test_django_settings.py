"""docs/howto/django.md: the settings as a Django project writes them take effect.

Django's ``django.conf:settings`` is a lazy view of the module ``DJANGO_SETTINGS_MODULE``
names; here that module is read directly (``proj.settings``), so no Django is needed. Each
check runs in a fresh interpreter: the how-to's modules configure Celery's current app.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_testing_plugin import titled_blocks, write_project

CHECK = """\
import json
import proj.celery
import accounts.tasks  # what app.autodiscover_tasks() imports in a Django project

app = proj.celery.app
task = app.tasks["accounts.tasks.sync_account"]
options, url, signum = task.lease_settings()
print(json.dumps({
    "url": url, "ttl": options.ttl, "interval": options.renew_interval,
    "on_conflict": options.on_conflict,
    "key": task.lease_key_for((7,)), "noeviction": app.conf.lease_require_noeviction,
    "beat_ttl": app.conf.lease_beat_ttl, "broker": app.conf.broker_url,
}))
"""


def run_project(tmp_path: Path, settings_extra: str = "") -> subprocess.CompletedProcess[str]:
    files = titled_blocks("howto/django.md")
    assert set(files) == {
        "proj/__init__.py",
        "proj/celery.py",
        "proj/settings.py",
        "accounts/tasks.py",
    }
    files["proj/celery.py"] = files["proj/celery.py"].replace(
        '"django.conf:settings"', '"proj.settings"'
    )
    files["proj/settings.py"] += settings_extra
    files["check.py"] = CHECK
    write_project(tmp_path, files)
    return subprocess.run(
        [sys.executable, "check.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )


def test_the_lease_settings_take_effect_through_the_celery_namespace(tmp_path: Path) -> None:
    run = run_project(tmp_path)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["url"] == "redis://localhost:6379/1"
    assert seen["ttl"] == 120.0  # the task option wins over CELERY_LEASE_TTL
    assert seen["on_conflict"] == "retry"
    assert seen["key"].startswith("shop-lease:{accounts.tasks.sync_account:")
    assert seen["noeviction"] is True and seen["beat_ttl"] == 30.0
    assert seen["broker"] == "redis://localhost:6379/0"


def test_a_setting_without_a_task_option_comes_from_the_settings_module(
    tmp_path: Path,
) -> None:
    run = run_project(tmp_path, "\nCELERY_LEASE_RENEW_INTERVAL = 7.5\n")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["interval"] == 7.5


def test_a_misspelt_lease_setting_is_refused_with_the_intended_name(tmp_path: Path) -> None:
    run = run_project(tmp_path, "\nCELERY_LEASE_TLL = 5.0\n")
    assert run.returncode != 0
    assert "lease_tll" in run.stderr and "lease_ttl" in run.stderr
