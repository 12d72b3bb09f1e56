"""Where an archive lives, read from ``--archive-url``: apart from :mod:`nsqx.storage.archive`
so that nsqd checks its flags at start without loading the archive code."""

from __future__ import annotations

import os
from urllib.parse import urlparse


def parse_url(url: str) -> tuple[str, str]:
    """("dir", absolute path) or ("s3", "bucket/prefix") of an archive URL; ValueError with
    what is wrong otherwise. Needs no pyarrow (nsqd checks its flags with it)."""
    u = urlparse(url)
    if u.scheme in ("", "file"):
        root = u.path if u.scheme == "file" else url
        if not root or not os.path.isabs(root):
            raise ValueError(f"archive directory must be an absolute path: {url!r}")
        return "dir", root.rstrip("/") or "/"
    if u.scheme == "s3":
        if not u.netloc:
            raise ValueError(f"s3 archive URL needs a bucket: {url!r}")
        return "s3", (u.netloc + "/" + u.path.strip("/")).rstrip("/")
    raise ValueError(f"archive URL must be a directory or s3://bucket/prefix: {url!r}")
