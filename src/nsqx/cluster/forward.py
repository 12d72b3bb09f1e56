"""The command a follower sends to forward a client's publish to the partition's leader:
built in ``nsqx.protocol.forward`` (nsqd's workers forward publishes with it too)."""

from __future__ import annotations

from nsqx.protocol.forward import forward_command, split_replayed, traced_offset

__all__ = ["forward_command", "split_replayed", "traced_offset"]
