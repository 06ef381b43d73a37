"""`build_spec`: the values a user gave (flags, YAML) as a checked `RunSpec`.

Every flag a run would ignore or could not use is refused before any data is
read, naming the flag (and the file, for a value from ``--config``). The
checks run in this order, so that each error names the first thing to fix:

1. each value within its field's bounds (``--timeout: expected > 0``);
2. the training settings that apply only to one mode or model
   (``--fanouts: only with --mode minibatch``, ``--heads: only with --model
   gat``), the partitioner's name, ``--verify``'s dataset;
3. the training settings themselves (:class:`~graphwire.run.config.TrainConfig`);
4. one process or distributed: on one process, every flag only a
   distributed run reads (``only="distributed"``: the strategies' flags,
   timeouts, checkpoints); distributed, the strategy flags of the other mode
   or of another strategy, and the settings that contradict the world;
5. ``--overwrite``: only with ``--out``, and not with ``--resume``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphwire.comm.context import WorkerContext, under_torchrun
from graphwire.graph.datasets import check_verifiable
from graphwire.options import OptionError, check_value
from graphwire.partition.base import check_method
from graphwire.run.config import TrainConfig
from graphwire.run.flags import Flag, FlagTable
from graphwire.run.spec import (
    CheckpointSpec,
    DataSpec,
    LaunchSpec,
    OutputSpec,
    PartitionSpec,
    RunSpec,
    StrategyChoice,
    option_applies,
)

__all__ = ["DISTRIBUTED_ONLY", "build_spec"]

DISTRIBUTED_ONLY = (
    "only for distributed runs (--workers N with N >= 2, or torchrun); "
    "--workers 1 trains in this process"
)
# Why a training setting of another mode or model is refused.
_ONLY_WHY = {
    "minibatch": "only with --mode minibatch",
    "fullgraph": "only with --mode fullgraph",
    "gat": "only with --model gat",
    "link": "only with --task link",
}


class _Given:
    """The values given, by flag ``dest``, and where each came from."""

    def __init__(
        self, table: FlagTable, values: Mapping[str, Any], sources: Mapping[str, str]
    ) -> None:
        self.table = table
        # False is not given: a switch left off (YAML's ``resume: false``).
        self.values = {
            d: v for d, v in values.items() if v is not None and v is not False
        }
        self.raw = dict(values)
        self.sources = dict(sources)

    def get(self, dest: str, default: Any = None) -> Any:
        value = self.raw.get(dest)
        return default if value is None else value

    def named(self, flag: Flag) -> str:
        """The flag, with the file it came from if ``--config``."""
        source = self.sources.get(flag.dest)
        return f"{flag.flag} (in {source})" if source else flag.flag

    def refuse(self, flags: list[Flag], why: str) -> None:
        """Raise, saying ``why``, if any of ``flags`` was given."""
        given = [self.named(f) for f in flags if f.dest in self.values]
        if given:
            raise ValueError(f"{' / '.join(given)}: {why}")


def build_spec(
    table: FlagTable, values: Mapping[str, Any], sources: Mapping[str, str]
) -> RunSpec:
    """The run ``values`` ask for (flag dest -> typed value, None: not given;
    ``sources``: dest -> the YAML file a value came from).

    Raises:
        ValueError: naming the flag of the first value refused (see the
            module docstring for the order).
    """
    given = _Given(table, values, sources)
    for dest, value in given.values.items():
        flag = table[dest]
        if flag.section != "train" and not flag.is_choice:
            value = _parsed(flag, value)
            try:
                check_value(flag.metadata, flag.name, value)
            except OptionError as error:
                raise ValueError(f"{flag.flag}: {error.why}") from None
    mode = given.get("mode", "fullgraph")
    model = given.get("model", "sage")
    task = given.get("task", "node")
    for condition, why in _ONLY_WHY.items():
        if not option_applies(
            condition, mode=mode, model=model, distributed=True, task=task
        ):
            flags = [f for f in table if f.only == condition and f.section == "train"]
            given.refuse(flags, why)
    check_method(given.get("partition"))
    if given.get("verify"):
        check_verifiable(given.get("dataset", DataSpec().dataset))
    train = _train_config(table, given)
    world, torchrun = _world(given)
    distributed = world > 1 or torchrun
    if distributed:
        _check_distributed(table, given, mode, world)
    else:
        _check_one_process(table, given, mode)
    _check_overwrite(table, given)
    sections: dict[str, Any] = {}
    for name, cls in (
        ("data", DataSpec),
        ("partition", PartitionSpec),
        ("launch", LaunchSpec),
        ("checkpoint", CheckpointSpec),
        ("output", OutputSpec),
    ):
        sections[name] = cls(**_fields(table, given, name, None))
    choices = {
        kind: _strategy(table, given, kind) if registry.mode == mode else None
        for kind, registry in table.registries.items()
    }
    fetch = choices.get("fetch")
    if train.task == "link" and distributed and fetch and fetch.name != "on-demand":
        raise ValueError(
            f"--task link: only with --fetch on-demand, not {fetch.name} (it "
            "samples each batch as it comes; the others make node batches)"
        )
    return RunSpec(
        mode=mode,
        train=train,
        world=world,
        torchrun=torchrun,
        exchange=choices.get("exchange"),
        fetch=choices.get("fetch"),
        **sections,
    )


def _parsed(flag: Flag, value: Any) -> Any:
    if flag.parse is None or not isinstance(value, str):
        return value
    try:
        return flag.parse(value)
    except ValueError as error:
        raise ValueError(f"{flag.flag}: {error}") from None


def _fields(
    table: FlagTable, given: _Given, section: str, strategy: str | None
) -> dict[str, Any]:
    """The given values of ``section``'s fields (of ``strategy``'s config)."""
    out = {}
    for flag in table.section(section):
        if flag.is_choice or flag.dest not in given.raw or given.raw[flag.dest] is None:
            continue
        if strategy is not None and strategy not in flag.strategies:
            continue
        out[flag.name] = _parsed(flag, given.raw[flag.dest])
    return out


def _train_config(table: FlagTable, given: _Given) -> TrainConfig:
    fields = _fields(table, given, "train", None)
    try:
        return TrainConfig(**fields)
    except ValueError as error:  # "field: why"; say the flag instead
        field, colon, why = str(error).partition(": ")
        flag = table.by_field("train", field, None)
        why = why.replace("num_layers=", "--layers ")
        why = why.replace("(None: ", "(leave it out: ")  # --patience
        raise ValueError(f"{flag.flag if flag else field}{colon}{why}") from None


def _world(given: _Given) -> tuple[int, bool]:
    """``(ranks, whether torchrun started this process)``."""
    workers = int(given.get("workers", 1))
    if not under_torchrun():
        return workers, False
    if not given.get("out"):
        raise ValueError("under torchrun, --out is required (one folder per run)")
    world = WorkerContext.from_env().world_size  # every variable checked
    if workers > 1 and workers != world:
        raise ValueError(
            f"--workers {workers}: torchrun started {world} workers "
            "(--nnodes x --nproc-per-node); leave --workers out under torchrun"
        )
    return world, True


def _check_one_process(table: FlagTable, given: _Given, mode: str) -> None:
    given.refuse([f for f in table if f.only == "distributed"], DISTRIBUTED_ONLY)
    parts = given.get("parts")
    if parts is not None and not given.get("partition"):
        raise ValueError(
            f"--parts {parts}: only with --partition (a distributed run "
            "has one part per worker)"
        )
    if mode == "minibatch":
        given.refuse(
            [table["node_order"]], "on one process, only with --mode fullgraph"
        )


def _check_distributed(table: FlagTable, given: _Given, mode: str, world: int) -> None:
    for kind, registry in table.registries.items():
        flags = table.section(kind)
        if registry.mode != mode:
            given.refuse(flags, f"only with --mode {registry.mode}")
            continue
        name = given.get(kind, registry.default)
        others = [f for f in flags if f.strategies and name not in f.strategies]
        for flag in others:
            strategies = " or ".join(flag.strategies)
            given.refuse([flag], f"only with {registry.flag} {strategies}")
        for flag in flags:
            other = flag.metadata.get("excludes")
            if other and flag.dest in given.values:
                excluded = table.by_field(kind, other, name)
                if excluded is not None and excluded.dest in given.values:
                    raise ValueError(
                        f"{given.named(flag)}: only without {excluded.flag}"
                    )
    parts = given.get("parts")
    if parts is not None and parts != world:
        raise ValueError(
            f"--parts {parts}: a distributed run has one part per worker "
            f"({world}); leave --parts out"
        )
    if not (given.get("checkpoint_every") or given.get("resume")):
        given.refuse(
            [table["keep_checkpoints"]], "only with --checkpoint-every or --resume"
        )


def _check_overwrite(table: FlagTable, given: _Given) -> None:
    """``--overwrite`` names the folder it replaces, and does not continue it."""
    if not given.get("overwrite"):
        return
    named = given.named(table["overwrite"])
    if not given.get("out"):
        raise ValueError(
            f"{named}: only with --out (without it the run writes a new folder)"
        )
    if given.get("resume"):
        raise ValueError(
            f"{named}: only without --resume (--overwrite replaces the run in "
            "--out, --resume continues it)"
        )


def _strategy(table: FlagTable, given: _Given, kind: str) -> StrategyChoice:
    """The strategy of ``kind`` the values name, with its config."""
    registry = table.registries[kind]
    strategy = registry.get(given.get(kind, registry.default))
    models = getattr(strategy.cls, "models", None)  # None: every model
    model = given.get("model", "sage")
    if models is not None and model not in models:
        flag = table[kind] if kind in table else None
        named = given.named(flag) if flag else f"--{kind}"
        raise ValueError(
            f"{named} {strategy.name}: only with --model {' or '.join(models)}, "
            f"not {model}"
        )
    fields = _fields(table, given, kind, strategy.name)
    try:
        config = strategy.config(**fields)
    except OptionError as error:
        flag = table.by_field(kind, error.field, strategy.name)
        named = given.named(flag) if flag else error.field
        why = error.why
        if error.other is not None:  # named by its flag
            other = table.by_field(kind, error.other, strategy.name)
            why = why.replace(error.other, other.flag if other else error.other)
        raise ValueError(f"{named}: {why}") from None
    return StrategyChoice(strategy.name, config)
