"""`RunSpec`: one typed specification of a training run.

A run is made of small frozen sections, each a dataclass of
:func:`~graphwire.options.option` fields whose defaults are written once,
on the field; the command line's flags and a YAML file's keys are derived from
them (:mod:`graphwire.run.flags`)::

    mode        fullgraph | minibatch
    data        DataSpec: the dataset and whether to verify its files
    partition   PartitionSpec: how the graph is split, into how many parts
    train       TrainConfig: the model, optimiser and loop
    exchange    the exchange engine and its config (full-graph)
    fetch       the fetcher and its config (mini-batch)
    launch      LaunchSpec: workers, backend, timeouts, threads, memory
    checkpoint  CheckpointSpec: how often, how many kept, resume
    output      OutputSpec: the run folder (and replacing it), progress bars

``graphwire train --print-spec`` prints a run's spec as YAML, which
``--config`` reads back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphwire.allocator import MAX_KEEP_FREED_MB
from graphwire.comm.context import DEFAULT_STALL_NOTICE_S, MAX_TIMEOUT_S
from graphwire.graph.datasets import DEFAULT_SPEC
from graphwire.options import check_options, option, option_fields
from graphwire.run.config import TrainConfig

__all__ = [
    "DEFAULT_NODE_ORDER",
    "MODES",
    "STRATEGY_KINDS",
    "NODE_ORDERS",
    "CheckpointSpec",
    "DataSpec",
    "LaunchSpec",
    "OutputSpec",
    "PartitionSpec",
    "RunSpec",
    "StrategyChoice",
    "option_applies",
]

MODES = ("fullgraph", "minibatch")
# The section (and flag) of each mode's strategy.
STRATEGY_KINDS = {"fullgraph": "exchange", "minibatch": "fetch"}
NODE_ORDERS = ("rcm", "id")
DEFAULT_NODE_ORDER = "rcm"  # how parts (and one process's rows) are numbered


def option_applies(
    only: str | None, *, mode: str, model: str, distributed: bool, task: str = "node"
) -> bool:
    """Whether an option with ``only`` (its field's metadata: ``distributed``,
    a mode, ``gat``, ``link``, or None for every run) applies to such a run."""
    if only == "link":
        return task == "link"
    if only == "distributed":
        return distributed
    if only in MODES:
        return mode == only
    if only == "gat":
        return model == "gat"
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class DataSpec:
    """The graph a run trains on."""

    dataset: str = option(
        DEFAULT_SPEC,
        help="dataset spec, e.g. synthetic:products?nodes=200000, "
        "planetoid:PATH/cora, ogb:PATH, npz:FILE, edgelist:FILE, a graph "
        "folder from graphwire data generate, or a partitioned folder",
    )
    verify: bool = option(
        False,
        help="check the graphwire files a run reads against their SHA-256 in "
        "meta.json as they load (a graph folder --dataset names, and each "
        "worker's part): reads them once more",
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionSpec:
    """How the graph is split (distributed runs: one part per worker)."""

    method: str | None = option(
        None,
        flag="--partition",
        help="random, chunk, metis, locality (G3: multi-constraint METIS, "
        "then halo-balancing refinement) or blocks (ByteGNN: --layers-hop "
        "blocks of the labelled nodes, balanced by split); with --workers, how "
        "the graph is "
        "split (unset: metis); on one process, also partition and report",
    )
    parts: int | None = option(
        None,
        least=1,
        help="one process: parts for --partition (unset: 4); distributed: one "
        "per worker",
    )
    node_order: str | None = option(
        None,
        choices=NODE_ORDERS,
        help="how rows are numbered: rcm puts neighbours close together "
        "(reverse Cuthill-McKee: faster sparse products), id keeps the graph's "
        "order; one process (full-graph): the graph's rows, with --workers the "
        "parts it writes (unset: rcm; not with a partitioned --dataset)",
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchSpec:
    """How the run's processes start and wait."""

    workers: int = option(
        1,
        least=1,
        help="worker processes for distributed training, one part each (1: "
        "train in this process)",
    )
    backend: str | None = option(
        None,
        choices=("gloo", "nccl"),
        only="distributed",
        help="the torch.distributed backend (unset: nccl where this machine has "
        "a GPU for each of its workers, else gloo; name it when machines of one "
        "run differ); under nccl the all-to-all exchanges are staged through "
        "each worker's GPU, point-to-point messages take a gloo group",
    )
    timeout: float = option(
        600.0,
        least=0,
        strict=True,
        most=MAX_TIMEOUT_S,
        only="distributed",
        help="seconds any wait may last (joining the ranks, each collective)",
    )
    stall_notice: float = option(
        DEFAULT_STALL_NOTICE_S,
        least=0,
        most=MAX_TIMEOUT_S,
        only="distributed",
        help="seconds a worker waits on its peers before it says which rank "
        "it waits on, where, and when --timeout ends the run (0: never)",
    )
    threads: int | None = option(
        None, least=1, help="torch threads per process (unset: workers take 1)"
    )
    keep_freed_mb: int = option(
        1024,
        least=0,
        most=MAX_KEEP_FREED_MB,
        help="freed memory each process's malloc keeps for reuse, MiB (glibc's "
        "mmap and trim thresholds; 0: glibc's defaults; left alone where "
        "MALLOC_*_THRESHOLD_, GLIBC_TUNABLES or a preloaded allocator are set)",
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSpec:
    """Checkpoints of a distributed run."""

    every: int | None = option(
        None,
        flag="--checkpoint-every",
        least=1,
        only="distributed",
        help="checkpoint every K epochs (and after the last)",
    )
    keep: int | None = option(
        None,
        flag="--keep-checkpoints",
        least=0,
        only="distributed",
        help="checkpoints kept, the newest (unset: 1, or as the run being "
        "resumed; 0 keeps all)",
    )
    resume: bool = option(
        False, only="distributed", help="continue from OUT/checkpoints"
    )

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputSpec:
    """Where a run writes, and what it prints."""

    out: str | None = option(
        None, help="run folder for metrics.jsonl (unset: runs/train-...)"
    )
    overwrite: bool = option(
        False,
        help="replace the run --out holds (its metrics, report, checkpoints and "
        "parts, nothing else); without it an --out holding a run is refused",
    )
    quiet: bool = option(False, help="no progress bars or per-epoch lines")

    def __post_init__(self) -> None:
        check_options(self)


@dataclass(frozen=True)
class StrategyChoice:
    """A strategy picked from a registry: its name and its config."""

    name: str
    config: Any


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A whole run (see the module docstring).

    ``exchange`` is set for full-graph runs, ``fetch`` for mini-batch ones.
    """

    mode: str = "fullgraph"
    world: int = 1  # the run's ranks: --workers, or torchrun's world
    torchrun: bool = False  # started by torchrun (this process is one rank)
    data: DataSpec = DataSpec()
    partition: PartitionSpec = PartitionSpec()
    train: TrainConfig = TrainConfig()
    exchange: StrategyChoice | None = None
    fetch: StrategyChoice | None = None
    launch: LaunchSpec = LaunchSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    output: OutputSpec = OutputSpec()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(
                f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}"
            )

    @property
    def distributed(self) -> bool:
        """Whether the run has more than one rank (or runs under torchrun)."""
        return self.world > 1 or self.torchrun

    def train_settings(self) -> dict[str, Any]:
        """The training settings this run uses, as JSON values (a full-graph
        run has no fan-outs, a GCN no attention heads)."""
        settings = self.train.as_dict()
        for field in option_fields(TrainConfig):
            if not self.applies(field.metadata.get("only")):
                del settings[field.name]
        return settings

    def applies(self, only: str | None) -> bool:
        """Whether an option with ``only`` applies to this run."""
        return option_applies(
            only,
            mode=self.mode,
            model=self.train.model,
            distributed=self.distributed,
            task=self.train.task,
        )

    @property
    def strategy_kind(self) -> str:
        """The kind of this run's strategy: ``exchange`` or ``fetch``."""
        return STRATEGY_KINDS[self.mode]

    @property
    def strategy(self) -> StrategyChoice | None:
        """The exchange (full-graph) or the fetcher (mini-batch)."""
        choice: StrategyChoice | None = getattr(self, self.strategy_kind)
        return choice
