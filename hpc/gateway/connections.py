"""What a connection to the gateway may hold: a request's head must come within `HEAD_TIMEOUT_S`, and the gateway
may keep as many connections open as the node lets a process.

Why: uvicorn keeps a connection that never sends a request, or sends its head byte by byte, open for good
(its keep-alive timeout only starts after a response: docs/decisions.md "The gateway's own time").
Each holds a file descriptor, and a gateway out of descriptors accepts no connection at all: a careless client
(or a slowloris) would take the deployment's one address down. nginx's `client_header_timeout` is the model:
a head not complete in time gets 408 and the connection is closed. The descriptor limit: login nodes often
give a process a soft limit of 1024 open files (each client connection is one), below the hard limit the
process may raise it to; the gateway raises it, as servers do.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: seconds from a connection's start (or a kept-alive connection's next request's first byte) to its request's
#: complete head
HEAD_TIMEOUT_S = 30.0
#: the open-files limit the gateway asks for where the hard limit is unlimited
OPEN_FILES = 65536


def timed_out(seconds: float) -> bytes:
    """The 408 answer, closing the connection."""
    text = f"the request's head did not come within {seconds:g} s".encode()
    head = "HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
    return f"{head}content-length: {len(text)}\r\n\r\n".encode() + text


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head is not complete `head_timeout_s`
    after the connection (or the request) began."""

    head_timeout_s = HEAD_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None

    @staticmethod
    def reporting(
        on_head_timeout: Callable[[float], None], head_timeout_s: float = HEAD_TIMEOUT_S
    ) -> type[HeadTimeoutProtocol]:
        """This protocol with `head_timeout_s`, telling `on_head_timeout` the deadline of each connection it
        closed (the gateway's metrics and access log); uvicorn takes a class, not an instance."""

        class Reporting(HeadTimeoutProtocol):
            def head_timed_out(self, waited_s: float) -> None:
                on_head_timeout(waited_s)

        Reporting.head_timeout_s = head_timeout_s
        return Reporting

    def head_timed_out(self, waited_s: float) -> None:
        """A connection was closed for its head: nothing more here (`reporting` tells someone)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a kept-alive connection's next request
            self._start_head_timer()

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _start_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.write(timed_out(self.head_timeout_s))
            self.transport.close()
            self.head_timed_out(self.head_timeout_s)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft open-files limit to its hard one (OPEN_FILES where that is unlimited); returns
    the limits before."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return soft, hard
