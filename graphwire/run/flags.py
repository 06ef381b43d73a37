"""The run specification on the command line and in YAML, derived from its fields.

:class:`FlagTable` lists one :class:`Flag` per option field of the spec's
sections and of every registered strategy's config, in the order
``--help`` shows them, each under its section's group (:class:`FlagGroup`:
``launch``, ``full-graph exchange``, ...). It adds them to ``graphwire
train``'s parser, reads a YAML file's keys onto them (a flat mapping of flag
names, or the sectioned form ``--print-spec`` writes), and turns the values
given into a checked :class:`~graphwire.run.spec.RunSpec`
(:mod:`graphwire.run.build`). No flag is written by hand: a strategy
registered with its config brings its flags.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from graphwire.options import field_type, flag_of, option_fields
from graphwire.run.config import TrainConfig
from graphwire.run.registry import Registry
from graphwire.run.spec import (
    MODES,
    CheckpointSpec,
    DataSpec,
    LaunchSpec,
    OutputSpec,
    PartitionSpec,
)

__all__ = ["PLAIN_SECTIONS", "Flag", "FlagGroup", "FlagTable", "flag_value"]

# The spec's sections that are one dataclass each, before and after the
# strategy sections (one per registry), in --help's order.
PLAIN_SECTIONS: dict[str, type] = {
    "data": DataSpec,
    "partition": PartitionSpec,
    "train": TrainConfig,
}
LATE_SECTIONS: dict[str, type] = {
    "launch": LaunchSpec,
    "checkpoint": CheckpointSpec,
    "output": OutputSpec,
}
# The title of a section's group in --help (a section not named here is
# titled by its name); the group's description is the first line of the
# section's docstring, or a strategy section's registry's.
_TITLES = {
    "data": "data",
    "partition": "partitioning",
    "train": "model and training",
    "launch": "launch",
    "checkpoint": "checkpoints and resume",
    "output": "output",
}
_MODE_TITLES = {"fullgraph": "full-graph", "minibatch": "mini-batch"}
_MODE_SECTION = "train"  # the group of --mode, how the run trains


@dataclass(frozen=True)
class Flag:
    """One command-line flag of the spec, and the field it sets.

    Attributes:
        dest: its name in the parsed arguments, and its key in a flat YAML file.
        flag: the flag (``--g3-mode``).
        section: the spec's section (``exchange``), or ``""`` for ``--mode``.
        name: the field's name in its section (``mode``); ``name`` for a
            registry's choice of strategy.
        kind: int, float, str or bool (what the flag's text becomes).
        choices: the values allowed (None: any).
        help: its line in ``--help``.
        default: the field's default (None: unset, the run decides).
        only: the runs it applies to (``distributed``, ``minibatch``,
            ``gat``, ...); None: every run.
        parse: how its text becomes the value when that is not ``kind``'s.
        strategies: for a strategy's option, the strategies that have it.
        registry: the registry of a strategy section.
        metadata: the field's option metadata (bounds).
    """

    dest: str
    flag: str
    section: str
    name: str
    kind: type
    choices: tuple[Any, ...] | None
    help: str
    default: Any
    only: str | None = None
    parse: Callable[[str], Any] | None = None
    strategies: tuple[str, ...] = ()
    registry: Registry | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_choice(self) -> bool:
        """Whether this is a registry's choice of strategy (``--exchange``)."""
        return self.registry is not None and not self.strategies


@dataclass(frozen=True)
class FlagGroup:
    """The flags of one section of the spec, as ``--help`` groups them.

    Attributes:
        section: the spec's section (``launch``, ``exchange``).
        title: the group's title (``launch``, ``full-graph exchange``).
        description: a line under the title: what the section is.
    """

    section: str
    title: str
    description: str


class FlagTable:
    """Every flag of ``graphwire train``'s run specification.

    Args:
        registries: the strategy registries, in --help's order (one section
            each, named by its kind).
    """

    def __init__(self, registries: Sequence[Registry]) -> None:
        self.registries = {registry.kind: registry for registry in registries}
        self._flags: dict[str, Flag] = {}
        self._groups: dict[str, FlagGroup] = {}
        self._add(
            Flag(
                dest="mode",
                flag="--mode",
                section="",
                name="mode",
                kind=str,
                choices=MODES,
                help="whole-graph epochs, or sampled mini-batches",
                default="fullgraph",
            )
        )
        for section, cls in PLAIN_SECTIONS.items():
            self._add_section(section, cls)
        for registry in registries:
            self._add_registry(registry)
        for section, cls in LATE_SECTIONS.items():
            self._add_section(section, cls)

    # ------------------------------------------------------------ building
    def _add(self, flag: Flag) -> None:
        known = self._flags.get(flag.dest)
        if known is None:
            self._flags[flag.dest] = flag
            return
        same = (known.section, known.name, known.kind) == (
            flag.section,
            flag.name,
            flag.kind,
        )
        if not (same and known.strategies and flag.strategies):
            raise ValueError(
                f"{flag.flag}: set by {known.section}.{known.name} and by "
                f"{flag.section}.{flag.name}; give one of them another flag"
            )
        merged = known.strategies + flag.strategies
        self._flags[flag.dest] = dataclasses.replace(known, strategies=merged)

    def _add_section(self, section: str, cls: type) -> None:
        about = (cls.__doc__ or "").strip().split("\n", 1)[0]
        title = _TITLES.get(section, section)
        self._groups[section] = FlagGroup(section, title, about)
        for field in option_fields(cls):
            self._add(_field_flag(section, cls, field))

    def _add_registry(self, registry: Registry) -> None:
        mode = _MODE_TITLES.get(registry.mode, registry.mode)
        self._groups[registry.kind] = FlagGroup(
            registry.kind,
            f"{mode} {registry.kind}",
            f"distributed --mode {registry.mode} runs: {registry.flag} and the "
            "options of its strategies",
        )
        self._add(
            Flag(
                dest=registry.kind,
                flag=registry.flag,
                section=registry.kind,
                name="name",
                kind=str,
                choices=tuple(registry.names()),
                help="; ".join(f"{s.name}: {s.about}" for s in registry),
                default=registry.default,
                only="distributed",
                registry=registry,
            )
        )
        for strategy in registry:
            for field in option_fields(strategy.config_type):
                flag = _field_flag(registry.kind, strategy.config_type, field)
                self._add(
                    dataclasses.replace(
                        flag,
                        only="distributed",
                        strategies=(strategy.name,),
                        registry=registry,
                    )
                )

    # ------------------------------------------------------------- reading
    def __iter__(self) -> Iterator[Flag]:
        return iter(list(self._flags.values()))

    def __getitem__(self, dest: str) -> Flag:
        return self._flags[dest]

    def __contains__(self, dest: object) -> bool:
        return dest in self._flags

    def section(self, section: str) -> list[Flag]:
        """The flags of one section, in order."""
        return [f for f in self if f.section == section]

    def by_field(self, section: str, name: str, strategy: str | None) -> Flag | None:
        """The flag that sets field ``name`` of ``section`` (of ``strategy``'s
        config, in a strategy section)."""
        for flag in self.section(section):
            if flag.name != name:
                continue
            if strategy is None or not flag.strategies or strategy in flag.strategies:
                return flag
        return None

    def groups(self) -> list[FlagGroup]:
        """The groups of ``--help``, one per section, in order."""
        return list(self._groups.values())

    def group(self, flag: Flag) -> FlagGroup:
        """The group ``flag`` is listed in: its section's."""
        return self._groups[flag.section or _MODE_SECTION]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add every flag to ``parser``, in its section's group, defaulting
        to None: a flag the command line left out reads None, whatever its
        field's default."""
        groups = {
            group.section: parser.add_argument_group(group.title, group.description)
            for group in self.groups()
        }
        for flag in self:
            kwargs: dict[str, Any] = {"dest": flag.dest, "default": None}
            if flag.kind is bool:
                kwargs["action"] = "store_true"
            else:
                kwargs["type"] = _arg_type(flag)
                if flag.choices is not None:
                    kwargs["choices"] = flag.choices
                if flag.metadata.get("metavar"):
                    kwargs["metavar"] = flag.metadata["metavar"]
            container = groups[self.group(flag).section]
            container.add_argument(flag.flag, help=_help(flag), **kwargs)


def _field_flag(section: str, cls: type, field: dataclasses.Field[Any]) -> Flag:
    meta = field.metadata
    flag = flag_of(field)
    parse = meta.get("parse")
    kind = str if parse is not None else field_type(cls, field.name)[0]
    default = field.default if field.default is not dataclasses.MISSING else None
    return Flag(
        dest=flag.removeprefix("--").replace("-", "_"),
        flag=flag,
        section=section,
        name=field.name,
        kind=kind,
        choices=meta.get("choices"),
        help=meta["help"],
        default=default,
        only=meta.get("only"),
        parse=parse,
        metadata=meta,
    )


def _arg_type(flag: Flag) -> Callable[[str], Any]:
    """What argparse makes of the flag's text (a parsed flag is checked as
    the spec is built, so a bad one is named with the others' errors)."""
    return str if flag.parse is not None else flag.kind


def _help(flag: Flag) -> str:
    text = flag.help
    if flag.strategies:
        text += f" (only with {flag.registry.flag if flag.registry else ''} "
        text += " or ".join(flag.strategies) + ")"
    if flag.default is not None and flag.kind is not bool:
        text += f" (default {flag.default})"
    return text


def flag_value(flag: Flag, value: Any) -> Any:
    """A YAML ``value`` for ``flag``, as the command line would give it:
    converted by the flag's type and within its choices.

    Raises:
        ValueError: saying what was expected and what was found.
    """
    if flag.kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if flag.parse is not None and isinstance(value, list):
        value = ",".join(str(v) for v in value)  # fanouts: [10, 25]
    if isinstance(value, list | dict):
        raise ValueError(f"expected a single value, got {value!r}")
    kind = _arg_type(flag)
    try:
        if isinstance(value, bool):  # YAML's true/false: not a number or name
            raise ValueError
        value = kind(str(value))
    except (TypeError, ValueError):
        raise ValueError(f"expected {kind.__name__}, got {value!r}") from None
    if flag.choices is not None and value not in flag.choices:
        choices = ", ".join(map(str, flag.choices))
        raise ValueError(f"expected one of {choices}, got {value!r}")
    return value
