"""Store errors: the library's own, how one is described, and which ones waiting cannot cure.

A worker refuses to start on a permanent one (:mod:`celery_lease.ops.worker`); every other store
error is transient and handled by the lease policies (``lease_on_store_error``, renewal until
the local deadline).
"""

from __future__ import annotations

import ssl

from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError

__all__ = ["NotReplicated", "PrimaryUnconfirmed", "describe", "is_wrong_type", "permanent_error"]


class NotReplicated(RedisError):
    """A decision was not acknowledged by ``min_replicas`` replicas within the store timeout
    (:mod:`celery_lease.store.replicated`).

    A grant was released again (best effort; otherwise it lapses with its TTL), a dedupe claim
    removed. A :class:`redis.exceptions.RedisError`, so callers treat it as any store error: the
    task body does not run (``lease_on_store_error`` decides what happens instead); a publish
    with ``lease_dedupe`` is published without a claim
    (:func:`celery_lease.policies.dedupe.send`).
    """


class PrimaryUnconfirmed(RedisError):
    """A write through a Sentinel-managed client that the sentinels did not confirm landed on
    the primary they name now (:mod:`celery_lease.store.primary`): a failover moved the
    primary, or too few sentinels answered to know.

    A :class:`redis.exceptions.RedisError`, so it is handled as any store error: a grant is
    released again and the body does not run (``lease_on_store_error``); a renewal does not
    count and is tried again until the lease's local deadline.

    Attributes:
        moved_during_write: True when the client found a new primary while the write was in
            flight, so that the node it went to is not known (writing again is safe: every
            lease write is conditional on the token).
        unanswered: ``"host:port"`` of each sentinel that did not answer, when too few of the
            group answered to confirm anything (empty otherwise).
    """

    def __init__(
        self, message: str, moved_during_write: bool = False, unanswered: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.moved_during_write = moved_during_write
        self.unanswered = tuple(unanswered)

    def __reduce__(self) -> tuple[type, tuple[str, bool, tuple[str, ...]]]:  # with its fields
        return (type(self), (str(self), self.moved_during_write, self.unanswered))


def describe(error: BaseException) -> str:
    """``"ErrorType: message (on <topology and node>)"`` for logs and errors.

    redis-py 8's ``repr`` of a server error drops the message; the node is the one noted by the
    store function that got the error (:func:`celery_lease.store.routing.where`), if any.
    """
    text = f"{type(error).__name__}: {error}"
    node = getattr(error, "lease_store_where", None)
    return f"{text} (on {node})" if node else text


def is_wrong_type(error: BaseException) -> bool:
    """True when ``error`` is Redis' ``WRONGTYPE`` reply: the key is of another type than the
    command reads (a key celery-lease did not write, at a name it uses)."""
    return isinstance(error, ResponseError) and str(error).startswith("WRONGTYPE")


def permanent_error(error: BaseException, setting: str = "lease_backend") -> str | None:
    """A message naming the fix when ``error`` cannot go away by waiting, else None.

    Permanent: a wrong password or user, an ACL denial, a database the server does not have,
    a certificate the client or server refuses (wrong CA, expired). Transient (None): refused
    connections, timeouts, a loading or failing-over server.
    """
    text = f"{type(error).__name__}: {error}"
    lowered = text.lower()
    fix = _access_fix(error, lowered, setting) or _tls_fix(error, lowered, setting)
    return None if fix is None else f"{text}; {fix}"


def _access_fix(error: BaseException, lowered: str, setting: str) -> str | None:
    """The fix when the server refused who the client is or what it asked for (credentials, an
    ACL permission, the database), else None; ``lowered`` is the error's text in lower case."""
    if (
        isinstance(error, AuthenticationError)
        or "wrongpass" in lowered
        or "invalid username-password" in lowered
        or "noauth" in lowered
    ):
        return (
            f"the store refused the credentials: fix the user name and password "
            f"in {setting} (redis://user:password@host:6379/0)"
        )
    # Redis 7.0 words a command a script may not run as ERR, not NOPERM.
    if (
        isinstance(error, NoPermissionError)
        or "noperm" in lowered
        or "the user executing the script can't" in lowered
    ):
        return (
            f"the ACL user lacks a permission the lease store needs: grant the "
            f"rule `celery lease acl` prints (docs/deploying.md, section ACL), or use "
            f"another user in {setting}"
        )
    if "db index" in lowered:
        return f"the server has no such database: fix the database number in {setting}"
    return None


def _tls_fix(error: BaseException, lowered: str, setting: str) -> str | None:
    """The fix when TLS failed (a certificate out of its validity period, on either side, or
    any other handshake failure), else None; ``lowered`` is the error's text in lower case."""
    if "certificate has expired" in lowered or "certificate is not yet valid" in lowered:
        return (
            f"the server's TLS certificate is outside its validity period: renew "
            f"the certificate the server presents (its tls-cert-file), or fix this host's "
            f"clock; the CA in ssl_ca_certs of {setting} / lease_backend_options is not "
            f"the problem"
        )
    if "alert certificate expired" in lowered:
        return (
            f"the server refused the client certificate as expired: renew the "
            f"certificate in ssl_certfile (and its ssl_keyfile) in {setting} / "
            f"lease_backend_options"
        )
    if (
        "certificate" in lowered
        or "ssl" in lowered
        or "tls" in lowered
        or isinstance(error.__cause__ or error.__context__, ssl.SSLError)
    ):
        return (
            f"the TLS handshake failed: check ssl_ca_certs (the CA that signed the "
            f"server's certificate), ssl_certfile / ssl_keyfile (client certificate) and "
            f"the rediss:// host name in {setting} / lease_backend_options"
        )
    return None
