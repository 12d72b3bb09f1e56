"""``nsqx archive ls``: the Parquet files of tiered storage (docs/archive.md), read from the
archive itself (a directory or S3), no nsqd needed.

    nsqx archive ls orders --archive-url /mnt/archive
    nsqx archive ls orders --archive-url s3://bucket/nsq --archive-s3-endpoint 127.0.0.1:8333
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from nsqx.cli.common import help_when_bare
from nsqx.extras import install_command
from nsqx.storage.archive import Archive, ArchiveError

__all__ = ["add_archive_commands"]


def cmd_archive_ls(args: argparse.Namespace) -> int:
    try:
        archive = Archive(args.archive_url, s3_endpoint=args.archive_s3_endpoint or None)
        files = archive.files(args.topic)
    except ImportError:  # pragma: no cover - pyarrow is the archive extra
        print(f"nsqx archive: needs pyarrow: {install_command('archive')}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"nsqx archive ls: {e}", file=sys.stderr)
        return 2
    except (ArchiveError, OSError) as e:
        print(f"nsqx archive ls: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"key": k, "bytes": n} for k, n in files]))
        return 0
    for key, n in files:
        print(f"{n:>12}  {key}")
    print(f"{len(files)} files, {sum(n for _, n in files)} bytes", file=sys.stderr)
    return 0


def add_archive_commands(sub: Any) -> None:
    p = sub.add_parser("archive", help="tiered storage: the archived Parquet files",
                       description=__doc__.split("\n\n")[0])
    asub = p.add_subparsers(dest="archive_command", metavar="COMMAND")
    help_when_bare(p)
    ls = asub.add_parser("ls", help="list a topic's archived files (key and size)")
    ls.add_argument("topic", nargs="?", default=None, help="topic (all topics if omitted)")
    ls.add_argument("--archive-url", required=True,
                    help="the nsqd's --archive-url (a directory or s3://bucket/prefix)")
    ls.add_argument("--archive-s3-endpoint", default="", help="S3 endpoint (host:port or URL)")
    ls.add_argument("--json", action="store_true", help="one JSON list of {key, bytes}")
    ls.set_defaults(func=cmd_archive_ls)
