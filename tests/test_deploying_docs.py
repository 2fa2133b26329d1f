"""docs/deploying.md and its topic pages run: each Python block is a configuration the library
accepts, and the documented ACL is the rule generated from the commands the code sends
(:mod:`celery_lease.store.permissions`) and, applied with redis-cli to a real server, allows
every one of them and no more."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_lease import LeasedTask, store
from celery_lease.ops import cli
from celery_lease.store import lua, permissions
from tests.support.secure import SystemRedisServer

DOC = Path(__file__).parent.parent / "docs" / "deploying.md"
#: The deploying page and its topic pages (Sentinel, Cluster).
PAGES = [DOC, *sorted((DOC.parent / "deploying").glob("*.md"))]


def blocks(language: str) -> list[str]:
    return [
        block
        for page in PAGES
        for block in re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)
    ]


@pytest.mark.parametrize("source", blocks("python"))
def test_every_configuration_in_the_deploying_page_is_accepted(source: str) -> None:
    app = Celery("docs", broker="memory://", set_as_current=False)
    exec(source, {"app": app})
    app.finalize()

    @app.task(base=LeasedTask, shared=False, name=f"docs-{uuid.uuid4().hex[:6]}")  # type: ignore[misc]
    def job() -> None:
        pass

    job.lease_settings()  # raises LeaseConfigError for a configuration the library refuses


def test_the_documented_acl_is_the_rule_generated_from_the_commands_the_code_sends() -> None:
    (command,) = blocks("shell")
    assert command.strip() == permissions.setuser(
        "lease", "s3cret", permissions.DEFAULT_FEATURES, ["lease:*"]
    )


def test_the_documented_acl_applied_with_redis_cli_runs_a_lease_and_denies_config() -> None:
    (command,) = blocks("shell")
    with SystemRedisServer() as server:
        shell = command.replace("redis-cli", f"redis-cli -p {server.port}", 1)
        assert (
            subprocess.run(
                ["bash", "-c", shell], capture_output=True, text=True, check=True
            ).stdout.strip()
            == "OK"
        )
        client = store.client_for(f"redis://lease:s3cret@127.0.0.1:{server.port}/0", 1.0)
        assert permissions.denied(client, permissions.DEFAULT_FEATURES, ["lease"]) == []
        key, token = "lease:{docs}", uuid.uuid4().hex
        assert store.acquire(client, key, token, 5000, "{}").granted
        assert [i.key for i in cli.scan_leases(client, "lease")] == [key]
        assert store.release(client, key, token)
        client.hset("lease:{celery.beat:docs}:last-run", "entry", "1.0")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("CONFIG", "GET", "maxmemory-policy")


def test_every_lua_script_is_run_by_a_feature_so_its_commands_are_in_a_rule() -> None:
    run = {script for f in permissions.FEATURES.values() for script in f.scripts}
    assert set(lua.names()) - run == {"acl/acl_check-1.lua"}  # the check itself runs as EVAL


def test_a_scripts_commands_are_read_from_its_source_with_includes_and_pcalls() -> None:
    assert permissions.script_commands("lease/release_wake-3.lua") == (
        "get",
        "del",
        "set",
        "ltrim",
        "rpush",
        "pexpire",
    )
