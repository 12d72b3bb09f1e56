"""Cluster mode refuses a data path with topics imported from Go nsqd (issue 28 defect 6):
replication does not carry their imported-ids table, so FIN/REQ/TOUCH by Go id would break
on any other replica (docs/migrating.md says why and what to do)."""

from __future__ import annotations

import asyncio
import io
import shutil
from pathlib import Path

import pytest

from nsqx.cluster.member import NodeMember
from nsqx.migrate.importer import run_import
from nsqx.nsqd.node import NSQD
from nsqx.nsqd.options import parse_args
from tests.migrate.test_go_ids import FIXTURE


def test_cluster_mode_refuses_imported_topics(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE / "data", tmp_path / "go")
    data = tmp_path / "nsqx"
    err = io.StringIO()
    assert run_import(tmp_path / "go", data, out=io.StringIO(), err=err) == 0, err.getvalue()

    async def main() -> None:
        nsqd = NSQD(parse_args(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                f"--data-path={data}",
                                "--cluster-leadership-addresses=http://127.0.0.1:1"]))
        nsqd.plugins.append(NodeMember(nsqd, ["http://127.0.0.1:1"], "t"))
        try:
            with pytest.raises(SystemExit, match=r"cluster mode refused: topic partition\(s\) "
                               r"events/0, lonely/0, orders/0 hold messages imported from Go nsqd"):
                await nsqd.start()
        finally:
            await nsqd.stop()

    asyncio.run(main())
