"""Client exceptions. Every one carries an NSQ-style error ``code``.

Error frames from nsqd become :class:`NSQError` with the server's code (``E_BAD_TOPIC``,
``E_PUB_FAILED``, ``E_AUTH_FAILED``, ...) and text; failures on the client side use codes of
the same shape (``E_CONNECTION_CLOSED``, ``E_NO_CONNECTIONS``, ``E_CLOSED``, ``E_TIMEOUT``).
"""

from __future__ import annotations

from nsqx.protocol.errors import NON_FATAL_CODES

__all__ = [
    "ClosedError",
    "ConnectionClosedError",
    "NSQError",
    "NoConnectionsError",
    "error_from_frame",
]


class NSQError(Exception):
    """An NSQ error: ``code`` (e.g. ``"E_BAD_TOPIC"``) and ``text`` (the rest of the frame)."""

    code: str
    text: str

    def __init__(self, code: str, text: str = "") -> None:
        super().__init__(f"{code} {text}" if text else code)
        self.code = code
        self.text = text

    @property
    def fatal(self) -> bool:
        """True when nsqd closes the connection after sending this error."""
        return self.code not in NON_FATAL_CODES

    @property
    def retriable(self) -> bool:
        """True for transport failures (the command may not have reached nsqd)."""
        return False


class ConnectionClosedError(NSQError, ConnectionError):
    """The connection closed (or failed to open) before a response arrived."""

    def __init__(self, text: str = "connection closed", code: str = "E_CONNECTION_CLOSED") -> None:
        super().__init__(code, text)

    @property
    def retriable(self) -> bool:
        return True


class NoConnectionsError(NSQError, ConnectionError):
    """A producer had no open connection to any nsqd within its timeout."""

    def __init__(self, text: str = "no open connections") -> None:
        super().__init__("E_NO_CONNECTIONS", text)


class ClosedError(NSQError):
    """The producer/consumer was closed."""

    def __init__(self, text: str = "closed") -> None:
        super().__init__("E_CLOSED", text)


def error_from_frame(data: bytes) -> NSQError:
    """An error frame's payload ``b"E_CODE text"`` -> NSQError."""
    s = data.decode("utf-8", "replace")
    code, _, text = s.partition(" ")
    return NSQError(code or "E_UNKNOWN", text)
