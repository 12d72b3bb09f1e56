"""``nsqx archive ls`` on a real directory archive written by the archiver."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyarrow")

from nsqx.cli.nsqx_cmd import main  # noqa: E402
from nsqx.storage.archive import Archive  # noqa: E402
from nsqx.storage.archiver import Archiver  # noqa: E402
from tests.storage.test_archive import fill, make_log  # noqa: E402


def test_archive_ls(tmp_path, capsys) -> None:
    archive = Archive(str(tmp_path / "arch"))
    lg = make_log(tmp_path / "log")
    fill(lg)
    arch = Archiver(archive, throttle_bytes_per_sec=0)
    arch.add("orders", 3, lg)
    n = arch.run_once()
    arch.join()
    lg.close()
    assert main(["archive", "ls", "orders", "--archive-url", str(tmp_path / "arch"),
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [g["key"] for g in got] == archive.list("orders") and len(got) == n > 1
    assert all(g["bytes"] > 0 for g in got)
    assert main(["archive", "ls", "--archive-url", f"file://{tmp_path / 'arch'}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == n and lines[0].split()[1].startswith("topic=orders/date=")
    assert main(["archive", "ls", "nope", "--archive-url", str(tmp_path / "arch")]) == 0
    assert capsys.readouterr().out == ""
    assert main(["archive", "ls", "orders", "--archive-url", "relative"]) == 2
    assert "absolute path" in capsys.readouterr().err
