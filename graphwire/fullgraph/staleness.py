"""Bounded embedding staleness (SANCUS, ``--staleness``): when rows may stay home.

An owner sends a block of rows (one layer's rows of its part, or of one of
G3's bins) to peers that cache it. While the copy they hold is within the
bound, the owner skips the send and the peers compute with their cached,
older rows. A block is named by a *key*, the same on every rank that sends or
caches it (``(layer, root)`` for the broadcast engine; ``(layer, sender,
peer, bin)`` for G3).

The bounds (``--staleness SPEC``):

- ``none``: every block is sent every epoch (CAGNET; G3 as it is).
- ``epoch:K`` (SANCUS's epsilon_E, Algorithm 4): a block is sent in epoch
  ``e`` when ``e - stamp > K``, ``stamp`` being the epoch it was last sent;
  ``epoch:1`` sends every other epoch. Every rank knows every stamp, so
  every rank agrees without a message.
- ``adaptive:K`` (epsilon_A, Algorithm 5): a receiver checks its cached copy
  at the end of epoch ``e``: when ``e - stamp > K`` the block is due, and is
  sent in epoch ``e + 1`` (the paper's Fig. 14(b): a block sent in epoch 7
  is found too old in epoch 9 and sent in 10). In a lock-step run where all
  blocks are sent in epoch 0 this is one schedule for every owner; SANCUS's
  stagger comes from owners that run at different speeds. Here it comes from
  *phases*: owner ``j``'s epoch-0 send counts as made ``phase[j]`` epochs
  earlier, so its first resend comes that much sooner. The default phase of
  owner ``j`` of ``W`` is ``j * (K + 2) // W``, which spreads the owners'
  sends evenly over the period of ``K + 2`` epochs. Ages printed are true
  ages, never shifted.
- ``gap:X`` (epsilon_H, Algorithm 6): the owner sends a block when it has
  moved more than ``X`` from the copy it last sent, by ``--staleness-norm``:
  ``relative`` (``||H - H~||_F / ||H~||_F``, the default), ``frobenius``
  (``||H - H~||_F``) or ``max`` (``max |H - H~|``). Only the owner can tell,
  so the owners' decisions travel to the peers (the engine says how, and the
  ledger counts it).

Every block is sent in epoch 0 (no peer holds a copy yet), and evaluation
forwards send everything and leave caches and stamps alone.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from graphwire.options import OptionError, option

__all__ = [
    "KINDS",
    "NORMS",
    "Staleness",
    "StalenessSpec",
    "check_staleness",
    "default_phases",
    "staleness_norm_option",
    "staleness_option",
]

KINDS = ("none", "epoch", "adaptive", "gap")
NORMS = ("relative", "frobenius", "max")
_FORMS = "none, epoch:K, adaptive:K (K an integer >= 0) or gap:X (a number >= 0)"


@dataclass(frozen=True, slots=True)
class StalenessSpec:
    """A parsed ``--staleness`` value: its kind and bound."""

    kind: str = "none"
    bound: float = 0.0

    @classmethod
    def parse(cls, text: str) -> StalenessSpec:
        """``"none"``, ``"epoch:K"``, ``"adaptive:K"`` or ``"gap:X"``.

        Raises:
            ValueError: saying what was expected and what was found.
        """
        kind, sep, value = str(text).strip().partition(":")
        if kind == "none" and not sep:
            return cls()
        if kind not in KINDS[1:] or not sep:
            raise ValueError(f"expected {_FORMS}, got {text!r}")
        try:
            bound = int(value) if kind != "gap" else float(value)
        except ValueError:
            number = "an integer" if kind != "gap" else "a number"
            raise ValueError(
                f"{kind}: expected {number} after ':', got {text!r}"
            ) from None
        if not math.isfinite(bound) or bound < 0:
            raise ValueError(f"{kind}: the bound must be >= 0, got {text!r}")
        return cls(kind, float(bound))

    @property
    def skips(self) -> bool:
        """Whether a block may ever stay home."""
        return self.kind != "none"

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        bound = int(self.bound) if self.kind != "gap" else self.bound
        return f"{self.kind}:{bound:g}"


def staleness_option() -> Any:
    """An engine config's ``staleness`` field (``--staleness``): one
    definition, so that the flag table merges the engines' fields."""
    return option(
        "none",
        flag="--staleness",
        metavar="SPEC",
        help="SANCUS bounded embedding staleness: none, epoch:K (send every K+1 "
        "epochs), adaptive:K (staggered, K epochs after a receiver finds a "
        "copy too old) or gap:X (send when the rows moved more than X)",
    )


def staleness_norm_option() -> Any:
    """An engine config's ``staleness_norm`` field (``--staleness-norm``)."""
    return option(
        "relative",
        flag="--staleness-norm",
        choices=NORMS,
        help="gap:X measures ||H - H_sent|| relative to ||H_sent||, as a plain "
        "Frobenius norm, or as the largest entry",
    )


def check_staleness(text: str) -> StalenessSpec:
    """``staleness``'s value parsed; for a config's ``__post_init__``.

    Raises:
        OptionError: naming the field ``staleness``.
    """
    try:
        return StalenessSpec.parse(text)
    except ValueError as error:
        raise OptionError("staleness", str(error)) from None


def default_phases(world_size: int, bound: int) -> list[int]:
    """Owner ``j``'s phase under ``adaptive:bound``: ``j * (bound + 2) // W``."""
    return [j * (bound + 2) // world_size for j in range(world_size)]


class Staleness:
    """One rank's stamps and decisions for the blocks it sends or caches.

    Args:
        spec: the bound.
        norm: how ``gap`` measures a block's move (:data:`NORMS`).
        phases: per owner, ``adaptive``'s phase (None: :func:`default_phases`
            over ``world_size`` owners).
        world_size: the number of owners (for the default phases).
    Attributes:
        stamps: key -> the epoch its block was last sent.
        due: keys ``adaptive`` found too old at the end of the last epoch.
    """

    def __init__(
        self,
        spec: StalenessSpec,
        norm: str = "relative",
        *,
        world_size: int = 1,
        phases: Sequence[int] | None = None,
    ) -> None:
        if norm not in NORMS:
            raise ValueError(f"staleness norm: expected one of {NORMS}, got {norm!r}")
        self.spec, self.norm = spec, norm
        if phases is None:
            phases = default_phases(world_size, int(spec.bound))
        self.phases = [int(p) for p in phases]
        self.stamps: dict[Hashable, int] = {}
        self.due: set[Hashable] = set()

    def must_send(self, key: Hashable, epoch: int, owner: int) -> bool:
        """Whether the block ``key`` of ``owner`` is sent in ``epoch``, by a
        rule every rank evaluates alike (``gap`` is the owner's:
        :meth:`moved`; here it says only whether the block was never sent)."""
        stamp = self.stamps.get(key)
        if stamp is None or self.spec.kind == "none":
            return True
        if self.spec.kind == "epoch":
            return epoch - stamp > self.spec.bound
        if self.spec.kind == "adaptive":
            return key in self.due
        return False

    def moved(self, new: torch.Tensor, sent: torch.Tensor) -> bool:
        """``gap``: whether ``new`` has moved beyond the bound from ``sent``."""
        delta = (new - sent).float()
        if self.norm == "max":
            gap = float(delta.abs().max()) if delta.numel() else 0.0
        else:
            gap = float(torch.linalg.vector_norm(delta))
            if self.norm == "relative":
                gap /= max(float(torch.linalg.vector_norm(sent.float())), 1e-30)
        return gap > self.spec.bound

    def sent(self, key: Hashable, epoch: int) -> None:
        """Record that block ``key`` was sent (and cached) in ``epoch``."""
        self.stamps[key] = epoch
        self.due.discard(key)

    def age(self, key: Hashable, epoch: int) -> int:
        """Epochs since block ``key`` was sent (0: sent in ``epoch``)."""
        return epoch - self.stamps[key]

    def end_epoch(self, epoch: int, owners: Iterable[tuple[Hashable, int]]) -> None:
        """``adaptive``: after ``epoch``, mark the blocks too old to use again.

        ``owners`` are ``(key, owner)`` of the blocks this rank checks. A block
        sent in epoch 0 counts as sent ``phase[owner]`` epochs before."""
        if self.spec.kind != "adaptive":
            return
        for key, owner in owners:
            stamp = self.stamps.get(key)
            if stamp is None:
                continue
            clock = stamp - (self.phases[owner] if stamp == 0 else 0)
            if epoch - clock > self.spec.bound:
                self.due.add(key)

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"stamps": dict(self.stamps), "due": sorted(self.due, key=repr)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stamps = dict(state["stamps"])
        self.due = set(state["due"])
