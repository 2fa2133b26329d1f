"""Re-exports :mod:`harness.proxy`, the one home of the loopback TCP proxy."""

from harness.proxy import HOST, TcpProxy

__all__ = ["HOST", "TcpProxy"]
