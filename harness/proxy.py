"""A small loopback TCP proxy that can simulate network partitions."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable
from types import TracebackType

HOST = "127.0.0.1"
_POLL = 0.05  # seconds; how quickly the threads notice state changes
_CHUNK = 65536


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port``.

    ``blackhole()`` keeps every connection open but stops moving bytes in both
    directions (like a partition: clients hang until their own timeouts);
    bytes already sent stay queued in the kernel and flow again on ``heal()``.
    ``cut()`` closes all connections and refuses new ones until ``heal()``.
    ``hold_replies()`` stops only the server-to-client direction: commands reach the server and
    run, their replies wait (a reply in flight) until ``heal()``.
    Each connection uses two daemon threads; ``close()`` stops them all.
    """

    def __init__(self, target_port: int, target_host: str = HOST, port: int = 0) -> None:
        """Start listening right away; ``port=0`` picks a free port."""
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._replying = threading.Event()  # the server-to-client direction only
        self._replying.set()
        self._closed = False
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self.port = port
        self._listen()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._spawn(self._accept_loop, listener)

    def _accept_loop(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                ready, _, _ = select.select([listener], [], [], _POLL)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):  # listener closed under us
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)  # blocking; close() unblocks via shutdown
            client.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            self._spawn(self._pump, client, upstream, self._forwarding)
            self._spawn(self._pump, upstream, client, self._replying)

    def _pump(self, src: socket.socket, dst: socket.socket, direction: threading.Event) -> None:
        """Copy bytes from ``src`` to ``dst`` while forwarding (and ``direction``) is enabled."""

        def open_() -> bool:
            return self._forwarding.is_set() and direction.is_set()

        try:
            while not self._closed:
                if not self._forwarding.wait(_POLL) or not direction.wait(_POLL):
                    continue  # blackholed: leave the bytes in the kernel
                ready, _, _ = select.select([src], [], [], _POLL)
                if not ready or not open_():
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        for sock in socks:
            with self._lock:
                self._conns.discard(sock)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _drop_all(self) -> None:
        with self._lock:
            conns = list(self._conns)
        self._drop(*conns)

    def _stop_listening(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    def blackhole(self) -> None:
        """Stop forwarding bytes in both directions; connections stay open."""
        self._forwarding.clear()

    def hold_replies(self) -> None:
        """Stop forwarding the server's replies; commands still reach the server and run."""
        self._replying.clear()

    def cut(self) -> None:
        """Close every connection and refuse new ones (ECONNREFUSED)."""
        self._stop_listening()
        self._drop_all()

    def heal(self) -> None:
        """Forward again and accept new connections (on the same port)."""
        if self._closed:
            raise RuntimeError("proxy is closed")
        self._forwarding.set()
        self._replying.set()
        if self._listener is None:
            self._listen()

    def close(self, timeout: float = 2.0) -> None:
        """Stop listening, close all connections and join the threads."""
        self._closed = True
        self._forwarding.set()
        self._replying.set()
        self.cut()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)

    def __enter__(self) -> TcpProxy:
        """Return the already listening proxy."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the proxy."""
        self.close()

    def __repr__(self) -> str:
        """Show both ends."""
        return f"<TcpProxy {HOST}:{self.port} -> {self.target[0]}:{self.target[1]}>"
