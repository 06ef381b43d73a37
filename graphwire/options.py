"""Typed options: config fields that carry their flag, help, choices and bounds.

A strategy's config is a frozen dataclass whose fields are made with
:func:`option`. The field's metadata is all the command line and YAML need
(flag name, help, choices, bounds), so a new strategy's flags appear in
``--help`` without a hand-kept table, and :func:`check_options` checks every
field in the config's ``__post_init__``::

    @dataclass(frozen=True, kw_only=True, slots=True)
    class G3Config:
        mode: str = option("full", flag="--g3-mode", choices=MODES,
                           help="G3 ablation: which overlaps to keep")
        bin_rows: int = option(32768, least=1, help="most rows in a bin")

        def __post_init__(self) -> None:
            check_options(self)

An invalid value raises :class:`OptionError` naming the field; the command
line names the flag or YAML key instead (:attr:`OptionError.field`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "OptionError",
    "check_options",
    "check_value",
    "field_type",
    "flag_of",
    "option",
    "option_fields",
]

_NO_DEFAULT: Any = dataclasses.MISSING


class OptionError(ValueError):
    """A config field's value is refused: ``str()`` is ``"field: why"``.

    Attributes:
        field: the field's name (the command line maps it to its flag).
        why: what was expected and what was found.
    """

    def __init__(self, field: str, why: str, *, other: str | None = None) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why
        self.other = other  # the field it conflicts with, if that is the trouble


def option(
    default: Any = _NO_DEFAULT,
    *,
    help: str,
    flag: str | None = None,
    choices: Sequence[Any] | None = None,
    least: float | None = None,
    strict: bool = False,
    most: float | None = None,
    excludes: str | None = None,
    only: str | None = None,
    parse: Callable[[str], Any] | None = None,
    folder: bool = False,
    metavar: str | None = None,
) -> Any:
    """A dataclass field with what the command line needs to offer it.

    Args:
        default: the field's default (written here once; None: unset, the
            strategy picks).
        help: one line for ``--help``; the default is added to it.
        flag: the command-line flag (default ``--`` + the field's name with
            dashes).
        choices: the values allowed.
        least: the least value allowed (numbers); with ``strict``, values
            must be above it.
        most: the largest value allowed (numbers).
        excludes: another field of the config that may not be set (not
            None) together with this one.
        only: the runs the option applies to (a condition the command line
            names, such as ``"minibatch"`` or ``"gat"``); it is refused in
            others rather than ignored.
        parse: how the command line's text becomes the value, for a field
            that is not an int, float, str or bool (``"10,25"`` -> a list);
            raises ValueError saying what was expected.
        folder: the value is a folder the run writes: the command line
            refuses one that exists and is not a folder, or cannot be made,
            before any work.
        metavar: the value's name in ``--help``.
    """
    metadata = {
        "help": help,
        "flag": flag,
        "choices": None if choices is None else tuple(choices),
        "least": least,
        "strict": strict,
        "most": most,
        "excludes": excludes,
        "only": only,
        "parse": parse,
        "folder": folder,
        "metavar": metavar,
    }
    return dataclasses.field(default=default, metadata=metadata)


def option_fields(config: Any) -> list[dataclasses.Field[Any]]:
    """The fields of a config class or instance made with :func:`option`."""
    return [f for f in dataclasses.fields(config) if "help" in f.metadata]


def flag_of(field: dataclasses.Field[Any]) -> str:
    """The command-line flag of ``field``."""
    flag: str | None = field.metadata.get("flag")
    return flag or "--" + field.name.replace("_", "-")


def field_type(config: Any, name: str) -> tuple[type, bool]:
    """``(base type, whether None is allowed)`` of field ``name``: one of
    int, float, str or bool."""
    hints = typing.get_type_hints(config if isinstance(config, type) else type(config))
    hint = hints[name]
    args = typing.get_args(hint)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if base not in (int, float, str, bool):
        raise TypeError(
            f"{name}: option fields are int, float, str or bool, not {hint}"
        )
    return base, optional


def check_options(config: Any) -> None:
    """Check (and normalise) every :func:`option` field of a frozen config.

    ints accept numpy integers and are stored as ``int``; floats accept any
    real number and are stored as ``float``; a number with bounds must be
    finite.

    Raises:
        OptionError: naming the first field whose value has the wrong type,
            is not among its choices, or is out of its bounds.
    """
    for field in option_fields(config):
        name, meta = field.name, field.metadata
        value = getattr(config, name)
        kind, optional = field_type(config, name)
        if value is None:
            if optional:
                continue
            raise OptionError(name, f"expected {_kind_name(kind)}, got None")
        value = _typed(name, value, kind)
        check_value(meta, name, value)
        other = meta["excludes"]
        if other is not None and getattr(config, other) is not None:
            raise OptionError(name, f"only without {other}", other=other)
        object.__setattr__(config, name, value)


def check_value(metadata: Mapping[str, Any], name: str, value: Any) -> None:
    """``value`` (of the field's type) within the choices and bounds of an
    option field's ``metadata``.

    Raises:
        OptionError: naming ``name``, with what was expected and found.
    """
    choices = metadata.get("choices")
    if choices is not None and value not in choices:
        listed = ", ".join(str(c) for c in choices)
        raise OptionError(name, f"expected one of {listed}, got {value!r}")
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        _check_bounds(
            name, float(value) if not isinstance(value, int) else value, metadata
        )


def _kind_name(kind: type) -> str:
    return {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
    }[kind]


def _typed(name: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise OptionError(name, f"expected true or false, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise OptionError(name, f"expected a string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptionError(name, f"expected {_kind_name(kind)}, got {value!r}")
    if kind is int:
        if not isinstance(value, numbers.Integral):
            raise OptionError(name, f"expected an integer, got {value!r}")
        return int(value)
    try:
        return float(value)
    except OverflowError:
        raise OptionError(
            name, f"expected a number a float holds, got {value}"
        ) from None


def _check_bounds(name: str, value: float, meta: Mapping[str, Any]) -> None:
    """``value`` within the field's bounds; with bounds, also finite."""
    least, strict, most = meta.get("least"), meta.get("strict"), meta.get("most")
    if least is None and most is None:
        return
    low = least is None or value > least or (value == least and not strict)
    high = most is None or value <= most
    if low and high and math.isfinite(value):
        return
    parts = []
    if least is not None:
        parts.append(f"{'>' if strict else '>='} {least:g}")
    if most is not None:
        parts.append(f"<= {most:g}")
    bound = " and ".join(parts)
    if most is None and not math.isfinite(value):
        bound = f"a finite value {bound}"
    raise OptionError(name, f"expected {bound}, got {value}")
