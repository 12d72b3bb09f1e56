"""`nsqx spark ...` argument handling (no Spark started)."""

from __future__ import annotations

import pytest

from nsqx.cli.nsqx_cmd import build_parser, main
from nsqx.spark.jobs import parse_time_ms


def test_parser_has_the_spark_group() -> None:
    args = build_parser().parse_args(
        ["spark", "archive", "--nsqd", "h:4151", "--topic", "t", "--to", "/tmp/a",
         "--max-offsets-per-trigger", "10", "--option", "failOnDataLoss=false",
         "--conf", "spark.ui.enabled=false", "--available-now"])
    assert (args.command, args.spark_command, args.topic, args.to) == ("spark", "archive", "t",
                                                                       "/tmp/a")
    assert args.option == [("failOnDataLoss", "false")] and args.available_now
    args = build_parser().parse_args(["spark", "stats", "--lookupd", "h:4161", "--topic", "t",
                                      "--from", "2026-11-22T10:00", "--json"])
    assert (args.from_, args.json) == ("2026-11-22T10:00", True)


# (no --nsqd and no --lookupd is no error since issue 24: the local nsqd, 127.0.0.1:4151 -
# tests/cli/test_flags.py)
@pytest.mark.parametrize("argv", [
    ["spark", "archive", "--nsqd", "a:1", "--lookupd", "b:1", "--topic", "t", "--to", "d"],
    ["spark", "archive", "--nsqd", "a:1", "--topic", "t", "--to", "d", "--option", "novalue"],
    ["spark", "stats", "--nsqd", "a:1"],  # no topic and no archive
    ["spark", "nope"],
])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    assert "error" in capsys.readouterr().err


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["spark"]) == 2
    assert "archive" in capsys.readouterr().out


def test_stats_bad_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["spark", "stats", "--nsqd", "a:1", "--topic", "t", "--from", "noon"]) == 2
    assert "bad time" in capsys.readouterr().err


def test_parse_time_ms() -> None:
    assert parse_time_ms("1700000000000") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T22:13:20") == 1_700_000_000_000
    assert parse_time_ms(None) is None


def test_trace_report_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["spark", "trace-report", "--nsqd", "h:4151", "--out", "d",
                                      "--topic", "orders", "--top", "3"])
    assert (args.spark_command, args.out, args.topic, args.top) == ("trace-report", "d",
                                                                    "orders", 3)
    for argv in (["spark", "trace-report", "--nsqd", "a:1", "--lookupd", "b:1", "--out", "d"],
                 ["spark", "trace-report", "--nsqd", "h:1"]):  # no --out
        with pytest.raises(SystemExit) as ei:
            main(argv)
        assert ei.value.code == 2
