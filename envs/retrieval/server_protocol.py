"""The HTTP/1.1 protocol the uvicorn engine runs: h11 with a capped request head and a deadline for it.

uvicorn's default parser (httptools) reads request headers of any size, before the app (and its
token check) sees the request, and no uvicorn protocol bounds the time a client takes to send a
request head: a client that sends one byte a second holds its connection forever. So the server
runs uvicorn's h11 protocol with

- the head capped at ``max_header_bytes`` (h11's ``max_incomplete_event_size``, passed by
  :func:`uvicorn_options`): a longer head is answered 431 and its connection closed, after reading
  little more than the cap;
- a deadline for the whole head (:class:`GuardedH11Protocol`): ``header_timeout_s`` from the
  connection's opening, or from the first byte of the next request on a kept-alive connection;
  bytes arriving slowly do not extend it. Past it the client gets 408 and the connection closes;
- ``keep_alive_s`` for idle kept-alive connections and ``max_connections`` (uvicorn's
  ``limit_concurrency``: a request beyond it gets 503).

The header count and the body's deadline are checked by the app's guard
(``envs/retrieval/server_app.py``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from envs.retrieval.server_models import ServerLimits


def _closing_response(status: int, phrase: str, reason: str) -> bytes:
    body = json.dumps({"error": reason}).encode()
    return (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head (``header_timeout_s``)."""

    header_timeout_s: float = ServerLimits.header_timeout_s
    max_header_bytes: int = ServerLimits.max_header_bytes  # the h11 cap uvicorn was given (uvicorn_options)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that never sends a byte is dropped too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is in (or the connection failed)
            self._cancel_head_timer()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse; 431 when the head outgrew the cap."""
        cap = self.max_header_bytes
        if len(self.conn.trailing_data[0]) > cap and not self.transport.is_closing():
            reason = f"the request line and headers are over the server's cap max_header_bytes={cap}"
            self.transport.write(_closing_response(431, "Request Header Fields Too Large", reason))
            self.transport.close()
            return
        super().send_400_response(msg)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            reason = f"the request head took longer than the server's header_timeout_s={self.header_timeout_s:g}"
            self.transport.write(_closing_response(408, "Request Timeout", reason))
            self.transport.close()


class RepeatedWarnings(logging.Filter):
    """Lets uvicorn's per-request warnings ("Invalid HTTP request received.", "Exceeded concurrency
    limit.") through at most once per ``every`` seconds each, with the count of those held back:
    a flood of bad requests must not become a flood of log lines."""

    MESSAGES = ("Invalid HTTP request received.", "Exceeded concurrency limit.")

    def __init__(self, every: float = 60.0):
        super().__init__()
        self.every = every
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message not in self.MESSAGES:
            return True
        now = time.monotonic()
        if now - self._last.get(message, -self.every) < self.every:
            self._held[message] = self._held.get(message, 0) + 1
            return False
        held, self._last[message] = self._held.pop(message, 0), now
        if held:
            record.msg, record.args = f"{message} ({held} more in the last {self.every:g} s)", ()
        return True


def quiet_repeated_warnings(every: float = 60.0) -> None:
    """Install :class:`RepeatedWarnings` on uvicorn's error logger (once)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, RepeatedWarnings) for f in logger.filters):
        logger.addFilter(RepeatedWarnings(every))


def uvicorn_options(limits: ServerLimits) -> dict:
    """``uvicorn.Config`` keyword arguments that enforce ``limits``' connection and time caps."""
    protocol = type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": float(limits.header_timeout_s),
                                                                  "max_header_bytes": int(limits.max_header_bytes)})
    return {"http": protocol, "h11_max_incomplete_event_size": int(limits.max_header_bytes),
            "limit_concurrency": int(limits.max_connections), "timeout_keep_alive": float(limits.keep_alive_s)}
