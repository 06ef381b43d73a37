"""`Registry`: the strategies of one kind by name, each with its config type.

``--exchange NAME`` and ``--fetch NAME`` each look up one registry entry: the
class that implements the strategy and the frozen dataclass of
:func:`~graphwire.options.option` fields that configures it. The command
line derives the strategy's flags and YAML keys from those fields, so a new
strategy is one module plus one registry line::

    EXCHANGES.register("toy", ToyEngine, ToyConfig, about="...")

after which ``graphwire train --exchange toy --toy-rows 3`` works, and
``--toy-rows`` is refused with any other exchange.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from graphwire.options import option_fields

__all__ = ["Registry", "Strategy"]


@dataclass(frozen=True)
class Strategy:
    """One registered strategy.

    Attributes:
        name: the name the flag takes (``g3``).
        cls: what implements it (an engine class, a fetcher class, ...).
        config_type: its config: a frozen dataclass whose fields are
            :func:`~graphwire.options.option` s (none for a strategy
            without settings).
        about: one line for ``--help``: the paper, and what moves.
    """

    name: str
    cls: type
    config_type: type
    about: str = ""

    def config(self, **values: Any) -> Any:
        """The strategy's config with ``values`` (by field name), checked."""
        return self.config_type(**values)


class Registry:
    """The strategies of one kind (``exchange``, ``fetch``), by name.

    Args:
        kind: the kind, which is also its flag (``--exchange``) and its
            section in a YAML run specification.
        mode: the training mode whose runs use it (``fullgraph``, ``minibatch``).
        default: the strategy a run takes when the flag is left out.
        base: the class every strategy of this kind derives from (checked
            when one registers).
    """

    def __init__(self, kind: str, *, mode: str, default: str, base: type) -> None:
        self.kind = kind
        self.mode = mode
        self.default = default
        self.base = base
        self._entries: dict[str, Strategy] = {}

    @property
    def flag(self) -> str:
        return "--" + self.kind

    def register(
        self, name: str, cls: type, config_type: type, *, about: str = ""
    ) -> Strategy:
        """Add strategy ``name``; registering the same one again is a no-op
        (a worker process imports the module that registered it once more).

        Raises:
            ValueError: ``name`` is taken by another strategy, ``cls`` does
                not derive from the registry's base class or declares another
                ``config_type``, or ``config_type`` is not a dataclass or
                configures another strategy already.
        """
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise ValueError(
                f"{self.kind} {name!r}: {cls!r} is not a {self.base.__name__}"
            )
        declared = getattr(cls, "config_type", config_type)
        if not (isinstance(declared, type) and issubclass(config_type, declared)):
            raise ValueError(
                f"{self.kind} {name!r}: {cls.__name__} takes a "
                f"{declared.__name__}, not a {config_type.__name__}"
            )
        if not dataclasses.is_dataclass(config_type):
            raise ValueError(
                f"{self.kind} {name!r}: {config_type!r} is not a dataclass"
            )
        entry = Strategy(name, cls, config_type, about)
        known = self._entries.get(name)
        if known is not None and (known.cls, known.config_type) != (cls, config_type):
            raise ValueError(f"{self.kind} {name!r}: registered already ({known.cls})")
        for other in self._entries.values():
            if other.name != name and other.config_type is config_type:
                raise ValueError(
                    f"{self.kind} {name!r}: {config_type.__name__} configures "
                    f"{other.name!r} already; each strategy has its own config"
                )
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove strategy ``name`` (a test's own, say); unknown names are
        ignored."""
        self._entries.pop(name, None)

    def resolve(self, choice: Any) -> tuple[Strategy, Any]:
        """``(strategy, config)`` of a strategy's name (with its default
        config) or of one of their configs.

        Raises:
            ValueError: an unknown name, or a config no strategy registered.
        """
        if isinstance(choice, str):
            entry = self.get(choice)
            return entry, entry.config()
        for entry in self._entries.values():
            if type(choice) is entry.config_type:
                return entry, choice
        raise ValueError(
            f"{self.kind}: {choice!r} configures none of {', '.join(self.names())}"
        )

    def get(self, name: str) -> Strategy:
        """The strategy registered as ``name``.

        Raises:
            ValueError: no strategy has that name (the known ones are listed).
        """
        if name not in self._entries:
            raise ValueError(
                f"{self.kind}: unknown {name!r}; known: {', '.join(self.names())}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        """The registered names, in the order they were registered."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Strategy]:
        return iter(list(self._entries.values()))

    def options(self, name: str) -> list[dataclasses.Field[Any]]:
        """The option fields of strategy ``name``'s config."""
        return option_fields(self.get(name).config_type)
