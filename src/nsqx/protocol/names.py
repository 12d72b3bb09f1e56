"""Topic and channel name rules (upstream ``internal/protocol/names.go``)."""

from __future__ import annotations

import re

__all__ = ["EPHEMERAL_SUFFIX", "is_ephemeral", "valid_channel_name", "valid_name", "valid_topic_name"]

EPHEMERAL_SUFFIX = "#ephemeral"
# fullmatch, not `$`: Python's `$` would accept a trailing newline, Go's does not
_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")
_NAME_RE_B = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


# Every PUB checks its topic name: remember the verdicts of the names seen (bounded, so
# a client inventing names cannot grow it) and skip the regex for them.
_VERDICTS: dict[str | bytes, bool] = {}
_MAX_VERDICTS = 4096


def valid_name(name: str | bytes) -> bool:
    """1..64 bytes (the ``#ephemeral`` suffix counts) of ``[.a-zA-Z0-9_-]``, optional suffix."""
    verdict = _VERDICTS.get(name)
    if verdict is not None:
        return verdict
    if not 1 <= len(name) <= 64:
        return False
    if isinstance(name, str):
        verdict = _NAME_RE.fullmatch(name) is not None
    else:
        verdict = _NAME_RE_B.fullmatch(name) is not None
    if len(_VERDICTS) < _MAX_VERDICTS:
        _VERDICTS[name] = verdict
    return verdict


valid_topic_name = valid_name
valid_channel_name = valid_name


def is_ephemeral(name: str | bytes) -> bool:
    """Memory-only topic/channel, deleted with its last client/channel."""
    if isinstance(name, bytes):
        return name.endswith(b"#ephemeral")
    return name.endswith(EPHEMERAL_SUFFIX)
