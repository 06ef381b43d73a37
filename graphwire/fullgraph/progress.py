"""What rank 0 of a distributed full-graph run prints after each epoch."""

from __future__ import annotations

from typing import Any

from graphwire.run.training import EpochRecord, format_acc
from graphwire.units import format_bytes

__all__ = ["epoch_lines", "print_epoch"]


def epoch_lines(record: EpochRecord) -> list[str]:
    """What rank 0 prints after an epoch: loss, accuracies and the time split;
    then, from :func:`~graphwire.fullgraph.distributed.traffic_by_rank`, the
    epoch's training bytes per layer (all ranks) and each rank's sent and
    received bytes."""
    times = record.times
    work = times["forward_s"] + times["backward_s"]
    comm = times.get("comm_s", 0.0)
    lines = [
        f"epoch {record.epoch:4d}  loss {record.loss:.4f}  "
        f"train {format_acc(record.train_acc)}  val {format_acc(record.val_acc)}  "
        f"test {format_acc(record.test_acc)}  compute {work - comm:.3f}s  "
        f"comm {comm:.3f}s  sync {times.get('sync_s', 0.0):.3f}s"
    ]
    traffic: dict[str, dict[str, list[int]]] = record.comm.get("by_rank", {})
    if traffic:
        kinds = "  ".join(
            f"{kind} {format_bytes(sum(counts['sent']))}"
            for kind, counts in traffic.items()
        )
        sent, recv = _per_rank(traffic, "sent"), _per_rank(traffic, "recv")
        ranks = "  ".join(
            f"{rank}: {format_bytes(s)} / {format_bytes(r)}"
            for rank, (s, r) in enumerate(zip(sent, recv, strict=True))
        )
        lines.append(f"           bytes {kinds}  |  sent / recv by rank  {ranks}")
    switch = record.extra.get("switch")
    if switch is not None:
        lines.append("           " + switch_line(switch))
    stale = record.extra.get("staleness")
    if stale is not None:
        lines.append("           " + staleness_line(stale, record.extra))
    return lines


def staleness_line(stale: dict[str, Any], extra: dict[str, Any]) -> str:
    """The epoch's skipped broadcasts or messages by (sending rank, layer)
    (G3's: ``skipped/messages`` as this rank saw them), each cached block's
    age by layer (the oldest per sending rank: 0 fresh), and each rank's
    cache."""
    if "messages" in stale:  # G3: messages per (sender, layer)
        skipped = " ".join(
            f"({r},{n}) {s}/{t}" for r, n, s, t in stale["messages"] if s
        )
    else:
        skipped = " ".join(f"({rank},{layer})" for rank, layer in stale["skipped"])
    first = stale.get("first_layer", 1)
    ages = "  ".join(
        f"L{first + k} " + ",".join(str(a) for a in row)
        for k, row in enumerate(stale["age"])
    )
    cache = max(stale["cache_bytes"], default=0)
    grads = "  gradients reused (SkipG)" if extra.get("grad_skipped") else ""
    return (
        f"skipped (rank,layer) {skipped or '-'}  |  age {ages}  |  cache "
        f"{format_bytes(cache)}/rank{grads}"
    )


def switch_line(switch: dict[str, Any]) -> str:
    """The epoch's switch (``--exchange switch``): each rank's link bytes up
    and down, the aggregator pool's peak and mean occupancy (rows, of the
    pool's rows per width), rows summed in the switch and forwarded raw
    (overflow), blocks per layer, and the reliability counters."""
    core = switch.get("core") or {}
    workers = switch["workers"]
    links = " ".join(
        f"{rank}: {format_bytes(up)}/{format_bytes(down)}"
        for rank, (up, down) in enumerate(
            zip(switch["up"], switch["down"], strict=True)
        )
    )
    pools = ",".join(str(rows) for rows in core.get("pool_rows", {}).values())
    blocks = " ".join(f"{k} {v}" for k, v in workers[0]["blocks"].items())
    retransmitted = sum(w["retransmitted"] for w in workers)
    fetched = sum(w["fetched"] for w in workers)
    return (
        f"switch link up/down {links}  |  aggregators peak {core.get('peak_slots', 0)}"
        f" mean {core.get('mean_slots', 0.0):.0f} of {pools or '-'}  |  rows "
        f"aggregated {core.get('aggregated', 0)} raw {core.get('raw', 0)}  |  "
        f"blocks {blocks or '-'}  |  retransmitted {retransmitted} bypassed "
        f"{core.get('bypassed', 0)} fetched {fetched} dropped "
        f"{core.get('dropped_frames', 0)} ecn {core.get('ecn_marks', 0)}"
    )


def print_epoch(record: EpochRecord) -> None:
    print("\n".join(epoch_lines(record)), flush=True)


def _per_rank(traffic: dict[str, dict[str, list[int]]], way: str) -> list[int]:
    """Each rank's bytes ``way`` (``sent`` or ``recv``), all kinds together."""
    columns = zip(*(counts[way] for counts in traffic.values()), strict=True)
    return [sum(column) for column in columns]
