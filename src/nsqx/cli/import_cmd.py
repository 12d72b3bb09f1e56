"""``nsqx import``: move a stopped Go nsqd's data (topics, channels, backlog) into nsqx.

    nsqx import --from-nsqd-data /var/lib/nsqd --data-path /var/lib/nsqx --dry-run
    nsqx import --from-nsqd-data /var/lib/nsqd --data-path /var/lib/nsqx

See docs/migrating.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nsqx.migrate.importer import ImportError_, run_import

__all__ = ["add_import_commands", "cmd_import"]


def cmd_import(args: argparse.Namespace) -> int:
    try:
        return run_import(args.from_nsqd_data, args.data_path, dry_run=args.dry_run,
                          max_msg_size=args.max_msg_size,
                          progress_interval=args.progress_interval)
    except ImportError_ as exc:
        print(f"nsqx import: {exc}", file=sys.stderr)
        return 2


def add_import_commands(sub: Any) -> None:
    """``nsqx import``."""
    p = sub.add_parser(
        "import", help="import a stopped Go nsqd's topics, channels and pending messages",
        description="Read Go nsqd's --data-path (nsqd.dat and its diskqueue files) and write "
                    "its topics, channels (paused flags too) and every channel's pending "
                    "messages into nsqx's --data-path. Stop Go nsqd first (SIGTERM: it "
                    "writes its memory queues to disk) and keep nsqx's nsqd stopped.")
    p.add_argument("--from-nsqd-data", required=True, metavar="GO_DATA_PATH",
                   help="Go nsqd's --data-path")
    p.add_argument("--data-path", required=True, metavar="NSQX_DATA_PATH",
                   help="nsqx nsqd's --data-path (created if missing; its topics must not "
                        "clash with the imported ones)")
    p.add_argument("--dry-run", action="store_true",
                   help="read everything, print the counts per topic and channel, write nothing")
    p.add_argument("--max-msg-size", type=int, default=1 << 20, metavar="BYTES",
                   help="Go nsqd's --max-msg-size (a larger size field is corruption; "
                        "default 1048576)")
    p.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS",
                   help="print messages done and msg/s to stderr this often (default 5)")
    p.set_defaults(func=cmd_import)
