"""`run_one_process`: a run on this process alone (``--workers 1``).

Claim the run folder (:func:`~graphwire.run.outputs.claim_run_folder`), load
the dataset, optionally partition it (``--partition``: to report what a
distributed run of the graph would face), run the mode's loop with a progress
bar, and write ``metrics.jsonl``: a ``config`` record, the ``partition``
record, one record per epoch and the ``summary``, whose fields are also
printed as one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphwire.allocator import keep_freed_memory
from graphwire.graph.graph import Graph
from graphwire.run.console import (
    check_trainable_dataset,
    console,
    epoch_progress,
    graph_rows,
    load_with_status,
    print_table,
)
from graphwire.run.mode import Mode
from graphwire.run.outputs import claim_run_folder
from graphwire.run.partitioning import check_parts_fit, partition_and_report
from graphwire.run.records import MetricsLog, format_summary, peak_rss_mb
from graphwire.run.spec import DEFAULT_NODE_ORDER, RunSpec
from graphwire.run.summary import first_and_rest, link_summary, with_task
from graphwire.run.tables import print_time_split
from graphwire.run.training import EpochRecord, TrainResult, format_acc

__all__ = ["run_one_process"]

_REPORTED_PARTS = 4  # the parts --partition reports without --parts


def run_one_process(spec: RunSpec, mode: Mode, out: Path) -> int:
    """Train ``spec`` here, writing into ``out``; the command's exit status."""
    dataset, quiet = spec.data.dataset, spec.output.quiet
    _refuse_partitioned(dataset)
    claim_run_folder(out, dataset, overwrite=spec.output.overwrite, resume=False)
    node_order = spec.partition.node_order or DEFAULT_NODE_ORDER
    keep_freed_memory(spec.launch.keep_freed_mb)
    if spec.launch.threads:
        import torch

        torch.set_num_threads(spec.launch.threads)
    graph = load_with_status(dataset, quiet, spec.data.verify)
    held_out = check_trainable_dataset(graph, dataset, spec.train)
    method = spec.partition.method
    parts = spec.partition.parts or _REPORTED_PARTS
    if method:
        check_parts_fit(graph, parts, dataset)
    rows = graph_rows(graph)
    if held_out is not None:  # link prediction: what the model never sees
        rows.append(("held-out edges (val / test)", "{:,} / {:,}".format(*held_out)))
    print_table("dataset", ["field", "value"], rows)
    minibatch = spec.mode == "minibatch"
    with MetricsLog(out) as log:
        log.write(
            "config",
            dataset=dataset,
            mode=spec.mode,
            **spec.train_settings(),
            keep_freed_mb=spec.launch.keep_freed_mb,
            **({} if minibatch else {"node_order": node_order}),
        )
        partition: dict[str, Any] = {}
        if method:
            partition = partition_and_report(
                graph, method, parts, spec.train.seed, quiet
            )
            log.write("partition", **partition)
        result = _train(graph, spec, mode, log, node_order)
        print_time_split(result)
        summary = _summary(result, partition)
        records = [r.as_dict() for r in result.records]
        summary = with_task(
            summary, spec.train.task, link_summary(records, result.best_epoch)
        )
        log.write("summary", **summary)
    console.print(f"metrics: {Path(out) / 'metrics.jsonl'}")
    print(format_summary(summary), flush=True)
    return 0


def _refuse_partitioned(dataset: str) -> None:
    """A partitioned folder is trained by one worker per part, not here."""
    from graphwire.partition.format import is_partitioned_folder, load_partition_meta

    if is_partitioned_folder(dataset):
        parts = load_partition_meta(dataset)["num_parts"]
        raise ValueError(
            f"--dataset {dataset}: a partitioned graph ({parts} parts); train it "
            f"with --workers {parts} (or under torchrun), or give the graph "
            "it was split from"
        )


def _train(
    graph: Graph, spec: RunSpec, mode: Mode, log: MetricsLog, node_order: str
) -> TrainResult:
    config = spec.train
    val = "val auc" if config.task == "link" else "val"
    with epoch_progress(config.epochs, spec.output.quiet) as progress:
        task = progress.add_task(
            f"{spec.mode} {config.model}", total=config.epochs, status=""
        )

        def on_epoch(record: EpochRecord) -> None:
            log.write("epoch", **record.as_dict())
            progress.update(
                task,
                completed=record.epoch + 1,
                status=f"loss {record.loss:.3f} {val} {format_acc(record.val_acc)}",
            )

        result = mode.train(graph, config, on_epoch, node_order)
        progress.update(task, total=result.epochs_run, completed=result.epochs_run)
    return result


def _summary(result: TrainResult, partition: dict[str, Any]) -> dict[str, Any]:
    epoch_s = [
        sum(v for k, v in r.times.items() if k != "eval_s") for r in result.records
    ]
    first_s, median_s = first_and_rest(epoch_s)
    summary: dict[str, Any] = {
        "test_acc": result.test_acc,
        "val_acc": result.val_acc,
        "epochs": result.epochs_run,
        "best_epoch": result.best_epoch,
        "epoch_s_median": median_s,
        "first_epoch_s": first_s,
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    for key in ("edge_cut", "halo_max", "imbalance_nodes"):
        if key in partition:
            summary[key] = partition[key]
    return summary
