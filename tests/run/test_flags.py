"""``graphwire train --help``: its flags grouped by the spec's sections."""

from __future__ import annotations

import argparse
import re

from graphwire.cli import build_parser
from graphwire.commands.train import flag_table


def _train_parser() -> argparse.ArgumentParser:
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    parser: argparse.ArgumentParser = commands.choices["train"]
    return parser


def _help_groups(text: str) -> dict[str, list[str]]:
    """The flags each group of ``--help`` lists, by the group's title."""
    groups: dict[str, list[str]] = {}
    title = None
    for line in text.splitlines():
        if re.fullmatch(r"\S.*:", line):
            title = line[:-1]
            groups[title] = []
        elif title is not None and (flag := re.match(r"  (--?[\w-]+)", line)):
            groups[title].append(flag.group(1))
    return groups


def test_train_help_groups_each_flag_under_its_section(monkeypatch) -> None:
    """Each flag of the spec is listed once, in its section's group (a
    strategy's options in their kind's); a flag added to a section, or a
    strategy registered, lands in its group with no edit to the command
    line (here the toy strategies')."""
    from tests.run import toys

    monkeypatch.setenv("COLUMNS", "200")  # one flag, one line
    toys.register()
    try:
        table = flag_table()
        groups = _help_groups(_train_parser().format_help())
    finally:
        toys.unregister()
    assert "--toy-rows" in groups["full-graph exchange"]
    assert "--toy-every" in groups["mini-batch fetch"]
    listed = [flag for flags in groups.values() for flag in flags]
    assert len(listed) == len(set(listed)), "a flag listed twice"
    for flag in table:
        title = table.group(flag).title
        assert flag.flag in groups.get(title, []), (flag.flag, title)
    # The command's own flags stay with --help; the spec's are grouped.
    assert set(groups["options"]) == {"-h", "--config", "--print-spec"}
    expected = [g.title for g in table.groups()]
    assert [t for t in groups if t != "options"] == expected
    assert len(expected) >= 7  # data ... output: not one long list
    for section, title in [
        ("launch", "launch"),
        ("exchange", "full-graph exchange"),
        ("fetch", "mini-batch fetch"),
    ]:
        assert table.group(table.section(section)[0]).title.startswith(title)
