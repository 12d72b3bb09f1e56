"""A message received by a :class:`~nsqx.client.Consumer`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from nsqx.storage.message_id import parse_id

if TYPE_CHECKING:
    from .conn import Connection

__all__ = ["Message"]


class _Responder(Protocol):  # the consumer
    def _msg_finish(self, msg: Message) -> None: ...
    def _msg_requeue(self, msg: Message, delay: float | None, backoff: bool) -> None: ...
    def _msg_touch(self, msg: Message) -> None: ...


class Message:
    """One delivery of a message.

    * ``id``: the 16-byte id (ASCII hex) echoed in FIN/REQ/TOUCH.
    * ``body``: bytes. ``timestamp``: publish time, ns since the epoch (as on the wire).
    * ``attempts``: delivery count, 1 on the first delivery (counted by nsqd).
    * ``partition`` / ``offset``: where the message lives in nsqx's log, decoded from the
      id (``None`` when the id is not an nsqx id, e.g. from upstream nsqd).
    * ``nsqd_address``: the nsqd that delivered it; ``connection``: its connection.

    Respond exactly once with :meth:`finish` or :meth:`requeue`; later calls are ignored.
    With the consumer's auto-finish (the default) a handler returning normally finishes the
    message and one raising requeues it; call :meth:`disable_auto_response` to respond
    yourself later (e.g. from another task).
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "connection", "_consumer",
                 "_responded", "_auto", "_pos", "_deadline")

    def __init__(self, msg_id: bytes, body: bytes, timestamp: int, attempts: int,
                 connection: Connection | None = None, consumer: _Responder | None = None) -> None:
        self.id = msg_id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.connection = connection
        self._consumer = consumer
        self._responded = False
        self._auto = True
        self._pos: tuple[int, int] | None | bool = False  # False: not parsed yet
        self._deadline = 0.0  # monotonic time after which nsqd has timed it out

    def __repr__(self) -> str:
        return (f"Message(id={self.id!r}, attempts={self.attempts}, "
                f"body=<{len(self.body)} bytes>)")

    # -- position in the log -------------------------------------------------------------
    def _position(self) -> tuple[int, int] | None:
        pos = self._pos
        if pos is False:
            try:
                pos = parse_id(self.id)
            except ValueError:
                pos = None
            self._pos = pos
        return pos  # type: ignore[return-value]

    @property
    def partition(self) -> int | None:
        pos = self._position()
        return None if pos is None else pos[0]

    @property
    def offset(self) -> int | None:
        pos = self._position()
        return None if pos is None else pos[1]

    @property
    def nsqd_address(self) -> str | None:
        return self.connection.address if self.connection is not None else None

    # -- responses ------------------------------------------------------------------------
    @property
    def has_responded(self) -> bool:
        return self._responded

    @property
    def auto_response(self) -> bool:
        return self._auto

    def disable_auto_response(self) -> None:
        """The handler will respond itself (finish/requeue) even after it returns."""
        self._auto = False

    def finish(self) -> None:
        """FIN: the message is done."""
        if self._responded:
            return
        self._responded = True
        if self._consumer is not None:
            self._consumer._msg_finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: deliver again after ``delay`` seconds.

        ``delay=None`` uses the consumer's default (``requeue_delay`` x attempts, capped at
        ``max_requeue_delay``). ``backoff=True`` makes the consumer back off (RDY 0, then a
        probe), as a handler failure does.
        """
        if self._responded:
            return
        self._responded = True
        if self._consumer is not None:
            self._consumer._msg_requeue(self, delay, backoff)

    def touch(self) -> None:
        """TOUCH: reset the server's in-flight timeout for this message."""
        if self._responded:
            return
        if self._consumer is not None:
            self._consumer._msg_touch(self)
