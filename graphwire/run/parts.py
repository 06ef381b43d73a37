"""The parts a distributed run trains on, and where it checkpoints.

A run trains on ``--dataset`` when that is a partitioned folder (one part per
worker); otherwise on ``OUT/partitions``, which its leader (rank 0) writes
anew, or which a resumed run keeps as it is (its checkpoints hold state for
those parts). A resume must keep the settings that decide its results, and
is refused, naming them, on others.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from graphwire.graph.links import split_links
from graphwire.partition.format import is_partitioned_folder, load_partition_meta
from graphwire.run.checkpoint import CheckpointConfig, saved_schedule
from graphwire.run.console import check_trainable_dataset, load_with_status
from graphwire.run.outputs import CHECKPOINTS, PARTITIONS, check_not_input
from graphwire.run.partitioning import write_parts
from graphwire.run.spec import DEFAULT_NODE_ORDER, RunSpec

__all__ = ["check_outputs", "checkpoint_config", "partitioned_folder"]


def partitioned_folder(spec: RunSpec, out: Path, leader: bool, resuming: bool) -> Path:
    """The parts the workers load: ``--dataset`` when it is partitioned;
    else ``OUT/partitions``, as they are when the run resumes from a
    checkpoint (whose settings name the same dataset), or written anew by
    the leader (a run that never reached a checkpoint, or another dataset's
    parts left in the folder, is split again)."""
    dataset, world = spec.data.dataset, spec.world
    method, node_order = spec.partition.method, spec.partition.node_order
    given = Path(dataset)
    if is_partitioned_folder(given):
        meta = _parts_meta(given, world, "--dataset")
        if method and method != meta["method"]:
            raise ValueError(
                f"--partition {method}: --dataset {given} is split "
                f"already (by {meta['method']}); leave --partition out, or give "
                "the graph it was split from"
            )
        if spec.train.task == "link" and meta.get("task") != "link":
            raise ValueError(
                f"--task link: --dataset {given} is split without held-out "
                "edges; give the graph it was split from"
            )
        if node_order and node_order != meta["node_order"]:
            raise ValueError(
                f"--node-order {node_order}: --dataset {given} is split "
                f"already (its parts numbered {meta['node_order']}); "
                "leave --node-order out, or give the graph it was split from"
            )
        return given
    folder = out / PARTITIONS
    if resuming:
        if not (folder / "meta.json").exists():
            raise ValueError(
                f"--resume: {folder} is gone; the checkpoints hold state for "
                "the parts the run trained on, so they cannot be resumed on new ones"
            )
        return _resumed_folder(spec, folder)
    if not leader:
        return folder  # rank 0 writes it; run_rank waits at the rendezvous
    quiet = spec.output.quiet
    graph = load_with_status(dataset, quiet, spec.data.verify)
    check_trainable_dataset(graph, dataset, spec.train)
    held_out = None
    if spec.train.task == "link":  # the parts hold the training edges only
        split = split_links(graph, **spec.train.held_out())
        graph, held_out = split.graph, (split.val, split.test)
    if world > graph.num_nodes:
        raise ValueError(
            f"{world} workers (--workers, or torchrun's world): more than the "
            f"{graph.num_nodes} nodes of {dataset}; each worker owns a part"
        )
    method = method or "metis"
    params = None
    if method == "blocks":  # as far as the model reads: K = its layers (the
        # comparison with METIS is for `graphwire partition`, not every run)
        params = {"hops": spec.train.num_layers, "compare": False}
    write_parts(
        graph,
        method,
        world,
        spec.train.seed,
        folder,
        quiet,
        node_order=node_order or DEFAULT_NODE_ORDER,
        params=params,
        held_out=held_out,
    )
    return folder


def check_outputs(spec: RunSpec, out: Path) -> None:
    """Refuse an ``--out`` whose parts (written unless ``--dataset`` is
    partitioned) or checkpoints (written and pruned) would replace the input."""
    dataset = spec.data.dataset
    written = [out / CHECKPOINTS] if _checkpoints(spec) else []
    if not is_partitioned_folder(dataset):
        written.append(out / PARTITIONS)
    for folder in written:
        check_not_input(folder, dataset, f"--out {out}: {folder}")


def _checkpoints(spec: RunSpec) -> bool:
    return bool(spec.checkpoint.every or spec.checkpoint.resume)


def _parts_meta(folder: Path, world: int, flag: str) -> dict[str, Any]:
    """``meta.json`` of the partitioned ``folder``, which ``flag`` brought in;
    its number of parts must be the number of workers."""
    meta = load_partition_meta(folder)
    if meta["num_parts"] != world:
        raise ValueError(
            f"{flag} {folder}: has {meta['num_parts']} parts, but {world} "
            f"workers were asked for"
        )
    return meta


def _resumed_folder(spec: RunSpec, folder: Path) -> Path:
    """The parts a run being resumed trained on, kept as they are (not split
    again, perhaps another way)."""
    meta = _parts_meta(folder, spec.world, "--resume")
    method, node_order = spec.partition.method, spec.partition.node_order
    if method and method != meta["method"]:
        raise ValueError(
            f"--resume: the run was partitioned with {meta['method']}, not "
            f"--partition {method}"
        )
    if node_order and node_order != meta["node_order"]:
        raise ValueError(
            f"--resume: the run's parts are numbered {meta['node_order']}, not "
            f"--node-order {node_order}"
        )
    return folder


def checkpoint_config(spec: RunSpec, out: Path) -> CheckpointConfig | None:
    """Where the run checkpoints, how often and how many it keeps (a resume
    keeps the run's unless ``--checkpoint-every`` / ``--keep-checkpoints``
    say otherwise), with the settings that decide its results, which a
    resume must keep: the dataset, the mode, the exchange or the fetch, and
    the training settings but the epoch count, patience and evaluation
    interval (speed and memory settings, such as G3's bins, may change)."""
    if not _checkpoints(spec):
        return None
    folder = out / CHECKPOINTS
    dataset = Path(spec.data.dataset)
    run: dict[str, Any] = {
        "dataset": str(dataset.resolve()) if dataset.exists() else spec.data.dataset,
        "mode": spec.mode,
    }
    settings = spec.train.as_dict()
    for free in ("epochs", "patience", "eval_every"):
        del settings[free]
    strategy = spec.strategy
    assert strategy is not None
    run[spec.strategy_kind] = strategy.name
    if spec.mode != "minibatch":
        for unused in ("fanouts", "batch_size"):  # mini-batch settings
            del settings[unused]
    saved = saved_schedule(folder) if spec.checkpoint.resume else {}
    every = spec.checkpoint.every or saved.get("every") or 10**9
    keep = spec.checkpoint.keep
    return CheckpointConfig(
        folder=str(folder),
        every=int(every),
        resume=spec.checkpoint.resume,
        run=run | settings,
        keep=saved.get("keep", 1) if keep is None else int(keep),
    )


def strategy_settings(spec: RunSpec) -> dict[str, Any]:
    """Every setting of the run's exchange or fetcher (defaults included),
    as its ``config`` record names them."""
    strategy = spec.strategy
    assert strategy is not None
    fields = dataclasses.asdict(strategy.config)
    if spec.mode == "minibatch":
        return {"fetch_options": {"fetch": strategy.name, **fields}}
    return {"exchange_options": fields}
