"""A run specification as YAML: ``--config FILE`` reads it, ``--print-spec`` writes it.

A file is a mapping in either of two forms, which may be mixed:

- flat, one key per flag (``epochs: 50``, ``g3-mode: inter``), as the
  command line spells them (``-`` or ``_``);
- sectioned, as ``--print-spec`` writes it: ``train: {epochs: 50}``,
  ``exchange: {name: g3, mode: inter}``, keys being the sections' field names.

Every value goes through its flag's type and choices, so a bad one is an
error naming the file and the key; a key given twice, or two keys setting
one flag, is refused (plain YAML keeps the last one silently).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from graphwire.run.flags import Flag, FlagTable, flag_value
from graphwire.run.spec import RunSpec

__all__ = ["load_config", "spec_yaml"]

# Flags of `graphwire train` that are not part of the spec.
_NOT_SPEC = ("config", "print_spec", "help", "command", "handler")


def load_config(table: FlagTable, path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The values ``path`` gives, by flag dest, and where each came from.

    Raises:
        ValueError: the file cannot be read, is not a YAML mapping, or holds
            an unknown key or a value its flag would refuse.
    """
    config = _read(path)
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}

    def put(flag: Flag, key: str, value: Any) -> None:
        if flag.dest in keys:
            raise ValueError(
                f"--config {path}: keys {keys[flag.dest]!r} and {key!r} set the same "
                "flag"
            )
        keys[flag.dest] = key
        if value is None:
            return  # null leaves the default
        try:
            values[flag.dest] = flag_value(flag, value)
        except ValueError as error:
            raise ValueError(f"--config {path}: {key}: {error}") from None

    for key, value in config.items():
        name = str(key)
        if isinstance(value, dict) and _is_section(table, name):
            _read_section(table, path, name, value, put)
            continue
        dest = name.replace("-", "_")
        if dest not in table or dest in _NOT_SPEC:
            raise ValueError(f"--config {path}: unknown key {key!r}")
        put(table[dest], name, value)
    return values, dict.fromkeys(values, path)


def _is_section(table: FlagTable, name: str) -> bool:
    return any(flag.section == name for flag in table)


def _read_section(
    table: FlagTable, path: str, section: str, body: dict[Any, Any], put: Any
) -> None:
    registry = table.registries.get(section)
    strategy = None
    if registry is not None:
        strategy = body.get("name") or registry.default
        put(table[registry.kind], f"{section}.name", body.get("name"))
    for key, value in body.items():
        if registry is not None and key == "name":
            continue
        flag = table.by_field(section, str(key), strategy)
        if flag is None or flag.is_choice:
            raise ValueError(f"--config {path}: unknown key '{section}.{key}'")
        put(flag, f"{section}.{key}", value)


def _read(path: str) -> dict[Any, Any]:
    try:
        with open(path) as handle:
            config = yaml.load(handle, Loader=_ConfigLoader)
    except OSError as error:
        raise ValueError(f"--config {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--config {path}: not a text file (UTF-8)") from None
    except yaml.YAMLError as error:
        raise ValueError(f"--config {path}: not valid YAML: {error}") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ValueError(
            f"--config {path}: not valid YAML: nested too deeply (a config "
            "is a mapping of flag: value)"
        ) from None
    if config is None:  # empty, or comments only
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"--config {path}: expected a mapping of flag: value")
    return config


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain
    YAML keeps the last silently, so an edit lower in a file would win unseen)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                repeated = key in seen
            except TypeError:  # unhashable: the safe loader's own error follows
                break
            if repeated:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found the key {key!r} twice",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def spec_yaml(table: FlagTable, spec: RunSpec) -> str:
    """``spec`` in the sectioned form, with the fields that apply to this run
    (a mini-batch run has no exchange, one process no checkpoints, a GCN no
    attention heads), so that ``--config`` reads it back to the same spec."""
    out: dict[str, Any] = {"mode": spec.mode}
    for section in ("data", "partition", "train"):
        out[section] = _section(table, spec, section, getattr(spec, section))
    choice = spec.strategy
    if choice is not None and spec.distributed:
        fields = dataclasses.asdict(choice.config)
        out[spec.strategy_kind] = {"name": choice.name, **fields}
    for section in ("launch", "checkpoint", "output"):
        body = _section(table, spec, section, getattr(spec, section))
        if body:
            out[section] = body
    text: str = yaml.safe_dump(out, sort_keys=False, default_flow_style=False)
    return text


def _section(
    table: FlagTable, spec: RunSpec, section: str, values: Any
) -> dict[str, Any]:
    out = {}
    for flag in table.section(section):
        if _applies(flag, spec):
            value = getattr(values, flag.name)
            out[flag.name] = list(value) if isinstance(value, tuple) else value
    return out


def _applies(flag: Flag, spec: RunSpec) -> bool:
    if flag.name == "node_order" and not spec.distributed:
        return spec.mode == "fullgraph"  # one process reorders full-graph rows only
    return spec.applies(flag.only)
