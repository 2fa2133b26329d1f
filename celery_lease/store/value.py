"""The stored value of a lease key: ``<token>:<fencing token>:<holder JSON>``.

The token is what every script compares; the fencing token and the holder (task, task id,
host, pid) are there for successors and operators: the conflict reply, ``celery lease ls``,
the skip marker and events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str

__all__ = ["Holder", "holder_json", "parse_value"]


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, parsed from the stored value.

    Attributes:
        token: the holder's per-execution token (str).
        fencing_token: int.
        task_name, task_id, hostname: str (empty when unknown).
        pid: int (0 when unknown).
    """

    token: str
    fencing_token: int
    task_name: str = ""
    task_id: str = ""
    hostname: str = ""
    pid: int = 0

    @property
    def where(self) -> str:
        """``"hostname:pid"``."""
        return f"{self.hostname}:{self.pid}"


def holder_json(task_name: str, task_id: str, hostname: str, pid: int) -> str:
    """The holder description stored in the lease value (compact JSON, ASCII only)."""
    if type(task_name) is type(task_id) is type(hostname) is str and type(pid) is int:
        # What json.dumps writes for these types, without its generic machinery (one call per
        # execution: an eighth of the cost).
        return (f'{{"task":{_json_str(task_name)},"id":{_json_str(task_id)},'
                f'"host":{_json_str(hostname)},"pid":{pid}}}')
    return json.dumps(
        {"task": task_name, "id": task_id, "host": hostname, "pid": pid}, separators=(",", ":")
    )


def parse_value(value: bytes | str) -> Holder:
    """Parse a stored lease value into a :class:`Holder` (tolerates foreign values)."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    token, _, rest = text.partition(":")
    fence, _, meta = rest.partition(":")
    try:
        info = json.loads(meta) if meta else {}
    except ValueError:
        info = {}
    if not isinstance(info, dict):
        info = {}
    return Holder(
        token=token,
        fencing_token=int(fence) if fence.isdigit() else 0,
        task_name=str(info.get("task", "")),
        task_id=str(info.get("id", "")),
        hostname=str(info.get("host", "")),
        pid=int(info.get("pid", 0) or 0),
    )
