"""What an entry point needs of ``--workers=N`` (N > 1): the supervisor's class and what makes
a process one worker. One module, so ``nsqx.cli.lazy`` loads both with one import."""

from __future__ import annotations

from nsqx.nsqd.workers.runtime import attach
from nsqx.nsqd.workers.supervisor import Supervisor

__all__ = ["Supervisor", "attach"]
