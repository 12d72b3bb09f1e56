"""``nsqx GROUP`` alone: the group's own help, listing its commands (issue 30, item 8)."""

from __future__ import annotations

import argparse

import pytest

from nsqx.cli.nsqx_cmd import build_parser, main


def _groups() -> dict[str, list[str]]:
    """Every command group of ``nsqx`` -> the names of its commands."""
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    out: dict[str, list[str]] = {}
    for name, parser in sub.choices.items():
        inner = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if inner:
            out[name] = list(inner[0].choices)
    return out


GROUPS = _groups()


def test_the_groups_are_found() -> None:
    assert {"topic", "cluster", "node", "channel", "spark", "archive"} <= set(GROUPS)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_group_alone_prints_its_commands(group: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main([group]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"usage: nsqx {group} "), out
    for command in GROUPS[group]:
        assert command in out, (group, command)
