"""docs/deploying.md runs: each Python block is a configuration the library accepts, and the
documented ACL, applied with redis-cli to a real server, is enough for a lease and no more."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_lease import LeasedTask, cli, store
from tests.support.secure import BEAT_COMMANDS, CLI_COMMANDS, TASK_COMMANDS, SystemRedisServer

DOC = Path(__file__).parent.parent / "docs" / "deploying.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


@pytest.mark.parametrize("source", blocks("python"))
def test_every_configuration_in_the_deploying_page_is_accepted(source: str) -> None:
    app = Celery("docs", broker="memory://", set_as_current=False)
    exec(source, {"app": app})
    app.finalize()

    @app.task(base=LeasedTask, shared=False, name=f"docs-{uuid.uuid4().hex[:6]}")  # type: ignore[misc]
    def job() -> None:
        pass

    job.lease_settings()  # raises LeaseConfigError for a configuration the library refuses


def test_the_documented_acl_is_the_tested_one_and_runs_a_lease() -> None:
    (command,) = blocks("shell")
    granted = set(re.findall(r"\+([a-z|\\]+)", command))
    assert {c.replace("\\", "") for c in granted} == {*TASK_COMMANDS, *BEAT_COMMANDS,
                                                     *CLI_COMMANDS}
    with SystemRedisServer() as server:
        shell = command.replace("redis-cli", f"redis-cli -p {server.port}", 1)
        assert subprocess.run(["bash", "-c", shell], capture_output=True, text=True,
                              check=True).stdout.strip() == "OK"
        client = store.client_for(f"redis://lease:s3cret@127.0.0.1:{server.port}/0", 1.0)
        key, token = "lease:{docs}", uuid.uuid4().hex
        assert store.acquire(client, key, token, 5000, "{}").granted
        assert [i.key for i in cli.scan_leases(client, "lease")] == [key]
        assert store.release(client, key, token)
        client.hset("lease:{celery.beat:docs}:last-run", "entry", "1.0")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.execute_command("CONFIG", "GET", "maxmemory-policy")
