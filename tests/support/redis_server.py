"""Re-exports :mod:`harness.redis_server`, the one home of private ``redis-server`` processes."""

from harness.redis_server import (
    BINARY_ENV,
    HOST,
    RedisServer,
    binary_version,
    free_port,
    no_retry,
    redis_server_binary,
)

__all__ = [
    "BINARY_ENV",
    "HOST",
    "RedisServer",
    "binary_version",
    "free_port",
    "no_retry",
    "redis_server_binary",
]
