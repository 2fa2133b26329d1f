"""Downstream stores that enforce fencing tokens: the guard that makes an outside effect safe.

A lease can be lost while its holder still runs (a pause longer than the lease lifetime, see
``docs/concepts.md``). The holder may then make one more write before it learns of the loss.
Only the place where the write lands can refuse it, and it can do so with one number: every
grant of a lease key carries a fencing token (``self.lease.fencing_token``) that is strictly
greater than every earlier grant's. A store that remembers the highest token it has accepted
for a record, and refuses a write carrying a lower one *in the same atomic step as the write*,
turns "two holders at once" into "the older holder's late writes are refused".

Two implementations of the same rule:

- :class:`RedisFencedStore`: a Lua script, so the check and the write are one server-side step;
- :class:`SqliteFencedStore`: one conditional ``INSERT ... ON CONFLICT DO UPDATE ... WHERE``.

A fencing token belongs to one lease key, so guard a record with the tokens of the lease that
protects it (e.g. the ledger of account 42 with the tokens of ``sync_account(42)``'s lease).
Equal tokens are accepted: the same execution writes many times.

A token is about 1.8e15 (the lease server's time in microseconds): it needs a signed 64-bit
integer. Redis keeps it as a decimal string (compared as one in Lua, whose numbers are
doubles); the SQL column is a ``BIGINT``, never a 32-bit ``INTEGER``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import redis

__all__ = ["FencedRecord", "RedisFencedStore", "SqliteFencedStore"]


@dataclass(frozen=True)
class FencedRecord:
    """What a fenced store holds for one record.

    Attributes:
        value: the last accepted value (``None`` when never written).
        fence: the highest fencing token accepted for the record (0 when never written).
        accepted: how many writes were accepted (int).
        refused: how many writes were refused for carrying a stale token (int).
    """

    value: str | None
    fence: int
    accepted: int
    refused: int


# Tokens are compared as decimal strings (length first, then text), never as Lua numbers,
# which are doubles and lose precision above 2**53.
_WRITE_LUA = """
local top = redis.call('HGET', KEYS[1], 'fence')
local new = ARGV[1]
if top and (#top > #new or (#top == #new and top > new)) then
  redis.call('HINCRBY', KEYS[1], 'refused', 1)
  return 0
end
redis.call('HSET', KEYS[1], 'fence', new, 'value', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'accepted', 1)
return 1
"""


class RedisFencedStore:
    """Records in Redis hashes whose writes are refused when their fencing token is stale.

    Args:
        client: a redis-py client (its timeouts apply to every call).
        prefix: prefix of the hash keys (``<prefix>:<name>``).
    """

    def __init__(self, client: redis.Redis, prefix: str = "fenced") -> None:
        self.client = client
        self.prefix = prefix
        self._write = client.register_script(_WRITE_LUA)

    def key(self, name: str) -> str:
        """The Redis key of record ``name``."""
        return f"{self.prefix}:{name}"

    def write(self, name: str, value: str, fencing_token: int) -> bool:
        """Store ``value`` in record ``name`` unless a higher token was already accepted.

        Args:
            name: the record.
            value: the new value.
            fencing_token: the writer's ``lease.fencing_token`` (int >= 0).

        Returns:
            True when written; False when refused (a later lease holder has written).

        Raises:
            redis.exceptions.RedisError: the store did not answer; the write may or may not
                have happened (retrying with the same token is safe).
        """
        if fencing_token < 0:
            raise ValueError(f"fencing_token must be >= 0, got {fencing_token}")
        return bool(self._write(keys=[self.key(name)], args=[str(int(fencing_token)), value]))

    def read(self, name: str) -> FencedRecord:
        """The current state of record ``name``."""
        raw: dict[Any, Any] = self.client.hgetall(self.key(name))
        fields = {_text(k): _text(v) for k, v in raw.items()}
        return FencedRecord(
            value=fields.get("value"),
            fence=int(fields.get("fence", 0)),
            accepted=int(fields.get("accepted", 0)),
            refused=int(fields.get("refused", 0)),
        )


class SqliteFencedStore:
    """The same guard as :class:`RedisFencedStore` as one conditional SQL statement.

    Args:
        path: the SQLite database file (``":memory:"`` for a private in-memory one).
    """

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS fenced ("
            " name TEXT PRIMARY KEY, value TEXT, fence BIGINT NOT NULL,"
            " accepted INTEGER NOT NULL DEFAULT 1, refused INTEGER NOT NULL DEFAULT 0)"
        )

    def write(self, name: str, value: str, fencing_token: int) -> bool:
        """Store ``value`` unless a higher token was accepted for ``name``; True when written.

        The ``WHERE`` of the upsert is the guard: SQLite evaluates it and writes in one
        statement, so no other writer can slip in between the check and the write.
        """
        if fencing_token < 0:
            raise ValueError(f"fencing_token must be >= 0, got {fencing_token}")
        cursor = self.db.execute(
            "INSERT INTO fenced (name, value, fence) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value, fence = excluded.fence, "
            " accepted = accepted + 1 WHERE excluded.fence >= fenced.fence",
            (name, value, int(fencing_token)),
        )
        if cursor.rowcount == 1:
            return True
        self.db.execute("UPDATE fenced SET refused = refused + 1 WHERE name = ?", (name,))
        return False

    def read(self, name: str) -> FencedRecord:
        """The current state of record ``name``."""
        row = self.db.execute(
            "SELECT value, fence, accepted, refused FROM fenced WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return FencedRecord(None, 0, 0, 0)
        return FencedRecord(row[0], int(row[1]), int(row[2]), int(row[3]))

    def close(self) -> None:
        """Close the database connection."""
        self.db.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
