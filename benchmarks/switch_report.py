"""bench_switch's figures: one run's from its ``metrics.jsonl``, the table of
a graph and worker count, and the check lines beside the paper's numbers.

benchmarks/ is not a package: the scripts put this folder on ``sys.path``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shaped_bench import epoch_records

__all__ = ["LEGEND", "Result", "Runs", "print_checks", "print_table", "result_of"]

MIB = 2**20
UNLIMITED = 1 << 40  # a pool larger than this is the switch's "unlimited"
PAPER_UL = "paper: 94% on Reddit at 128 parts"
PAPER_SWITCHGNN = "paper (Fig. 18f, Reddit, 128 workers): -23% at 10 MB, -81% at 100 MB"
TIMED = ("halo", "g3", "Straw-UL", "SwitchGNN-small")


@dataclass(slots=True)
class Result:
    """One run's figures; bytes are per epoch (mean over epochs), summed over
    ranks, sent plus received."""

    fwd_bytes: float  # fwd.*: rows to and from the switch, or between hosts
    bwd_bytes: float  # bwd.*
    fwd_sent: dict[str, float]  # each fwd.L{l} tag's bytes sent alone
    link_bytes: float | None = None  # switch links, up + down; None: no switch
    pool_rows: dict[str, int] = field(default_factory=dict)  # width -> rows
    peak_slots: int = 0  # the most over epochs
    mean_slots: float = 0.0  # mean over epochs
    raw: float = 0.0  # rows the switch forwarded raw (overflow), per epoch
    blocks: dict[str, int] = field(default_factory=dict)  # layer -> blocks
    timeouts: int = 0  # the workers', over epochs
    bypassed: int = 0  # rows the switch let bypass aggregation, over epochs
    epoch_s: float = 0.0  # rank 0's fwd+bwd+sync, median over epochs 1..
    wall_s: float = 0.0

    @property
    def train_bytes(self) -> float:
        return self.fwd_bytes + self.bwd_bytes

    @property
    def first_tag(self) -> str:
        """The first exchanged layer's tag: ``fwd.L{l}`` with the least ``l``."""
        return min(self.fwd_sent, key=lambda tag: int(tag.rsplit("L", 1)[1]))


def result_of(summary: dict[str, str], wall: float, out: Path) -> Result:
    """The figures of one ended run, from rank 0's records (``comm.by_rank``
    and ``extra.switch`` hold every rank's)."""
    del summary  # its figures are the records'
    lead = epoch_records(out)[0]
    fwd, bwd, link, sent = [], [], [], {}
    for record in lead:
        by_rank: dict[str, Any] = record["comm"]["by_rank"]
        both = {t: sum(v["sent"]) + sum(v["recv"]) for t, v in by_rank.items()}
        fwd.append(sum(b for t, b in both.items() if t.startswith("fwd.")))
        bwd.append(sum(b for t, b in both.items() if t.startswith("bwd.")))
        for tag, value in by_rank.items():
            if tag.startswith("fwd."):
                sent.setdefault(tag, []).append(sum(value["sent"]))
        switch = record.get("extra", {}).get("switch")
        if switch:
            link.append(sum(switch["up"]) + sum(switch["down"]))
    parts = ("forward_s", "backward_s", "sync_s")
    times = [sum(r["times"][k] for k in parts) for r in lead]
    result = Result(
        fwd_bytes=statistics.fmean(fwd),
        bwd_bytes=statistics.fmean(bwd),
        fwd_sent={t: statistics.fmean(b) for t, b in sent.items()},
        link_bytes=statistics.fmean(link) if link else None,
        epoch_s=statistics.median(times[1:] or times),
        wall_s=wall,
    )
    switches = [r["extra"]["switch"] for r in lead if "switch" in r.get("extra", {})]
    if switches:
        cores = [s["core"] for s in switches]
        result.pool_rows = {k: int(v) for k, v in cores[0]["pool_rows"].items()}
        result.peak_slots = max(int(c["peak_slots"]) for c in cores)
        result.mean_slots = statistics.fmean(float(c["mean_slots"]) for c in cores)
        result.raw = statistics.fmean(int(c["raw"]) for c in cores)
        result.bypassed = sum(int(c["bypassed"]) for c in cores)
        result.blocks = dict(switches[0]["workers"][0]["blocks"])
        result.timeouts = sum(w["timeouts"] for s in switches for w in s["workers"])
    return result


@dataclass(slots=True)
class Runs:
    """One graph and worker count: its parts' rows, the small memory, and
    each variant's result or failure."""

    graph: str
    workers: int
    halo_rows: int  # the parts': the sum over parts of the rows each reads
    boundary_rows: int  # the parts': rows some other part reads, once each
    small: tuple[float, int] | None = None  # (MiB, pool rows)
    results: dict[str, Result] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def width(self) -> int | None:
        """The first exchanged layer's row width F: a switch run's one width,
        or halo's (or g3's) bytes over the parts' halo rows; None: no run."""
        for result in self.results.values():
            if len(result.pool_rows) == 1:
                return int(next(iter(result.pool_rows)))
        for name in ("halo", "g3"):
            host = self.results.get(name)
            if host and host.fwd_sent and self.halo_rows:
                return round(host.fwd_sent[host.first_tag] / (4 * self.halo_rows))
        return None

    def uploads(self) -> int | None:
        """Straw-UL's uploaded rows at the first exchanged layer (each
        boundary row once); None: no Straw-UL or no width."""
        ul, width = self.results.get("Straw-UL"), self.width()
        if ul is None or width is None or not ul.fwd_sent:
            return None
        return round(ul.fwd_sent[ul.first_tag] / (4 * width))

    def size_small(self, share: int) -> None:
        """Set ``small``: a memory of ``1/share`` of Straw-UL's uploads, in
        whole 128-byte aggregators per row (as the switch counts them)."""
        rows, width = self.uploads(), self.width()
        if rows is None or width is None:
            return
        num_rows = max(1, math.ceil(rows / share))
        row_bytes = math.ceil(4 * width / 128) * 128
        self.small = num_rows * row_bytes / MIB, num_rows  # exact: MIB is 2**20


# ------------------------------------------------------------------ table
def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if value is not None else f"{'-':>{width}s}"


def _pool(result: Result) -> str:
    sizes = [r for _, r in sorted(result.pool_rows.items(), key=lambda kv: -int(kv[0]))]
    return "/".join("UL" if r > UNLIMITED else f"{r:,}" for r in sizes) or "-"


def _memory(variant: str, small: tuple[float, int] | None) -> str:
    memory = variant.split("-", 1)[1] if "-" in variant else "-"
    if memory == "small":
        return f"{small[0]:.4g}" if small else "?"
    return memory.removesuffix("MB")


def _blocks(result: Result) -> str:
    return ",".join(f"{k}:{v}" for k, v in result.blocks.items()) or "-"


def print_table(label: str, variants: list[str], runs: Runs) -> None:
    """One graph and worker count: its rows and small memory, then one line
    per variant."""
    print(f"\n{label}")
    width, uploads = runs.width(), runs.uploads()
    row_bytes = f", {math.ceil(4 * width / 128) * 128} B per pool row" if width else ""
    print(
        f"  parts: halo rows (sum of |R(v)|) {runs.halo_rows:,}, boundary rows "
        f"{runs.boundary_rows:,}; Straw-UL uploaded {_fmt(uploads, ',', 0)} rows "
        f"of F = {_fmt(width, 'd', 0)} floats{row_bytes}"
    )
    if runs.small:
        print(
            f"  small memory: {runs.small[0]:.4g} MiB = {runs.small[1]:,} pool rows "
            "(1/10 of Straw-UL's uploads)"
        )
    print(
        f"{'variant':16s} {'MiB':>6s} {'pool rows':>10s} {'fwdMiB/ep':>9s} "
        f"{'bwdMiB/ep':>9s} {'rowsMiB/ep':>10s} {'x halo':>7s} {'linkMiB/ep':>10s} "
        f"{'peak':>7s} {'mean':>8s} {'raw/ep':>8s} {'blocks':>8s} {'t/o':>4s} "
        f"{'ep s':>7s} {'x halo':>7s}"
    )
    halo = runs.results.get("halo")
    for variant in variants:
        row = runs.results.get(variant)
        if row is None:
            error = runs.failures.get(variant, "no run").strip().splitlines()
            print(f"{variant:16s} FAILED: {error[-1] if error else '?'}")
            continue
        link = row.link_bytes / MIB if row.link_bytes is not None else None
        on = link is not None  # a switch run
        print(
            f"{variant:16s} {_memory(variant, runs.small):>6s} {_pool(row):>10s} "
            f"{row.fwd_bytes / MIB:9.3f} {row.bwd_bytes / MIB:9.3f} "
            f"{row.train_bytes / MIB:10.3f} "
            f"{_fmt(row.train_bytes / halo.train_bytes if halo else None, '.3f', 7)} "
            f"{_fmt(link, '.3f', 10)} "
            f"{_fmt(row.peak_slots if on else None, ',', 7)} "
            f"{_fmt(row.mean_slots if on else None, ',.0f', 8)} "
            f"{_fmt(row.raw if on else None, ',.0f', 8)} {_blocks(row):>8s} "
            f"{_fmt(row.timeouts if on else None, 'd', 4)} {row.epoch_s:7.3f} "
            f"{_fmt(row.epoch_s / halo.epoch_s if halo else None, '.3f', 7)}"
        )


LEGEND = (
    "fwd/bwdMiB/ep: rows on the workers' links (fwd.*, bwd.*: to and from the "
    "switch, or between hosts), sent + received, summed over ranks, mean over "
    "epochs; rowsMiB/ep: both; x halo: rows over halo's;\nlinkMiB/ep: a "
    "switch run's every link byte (rows, "
    "headers, IDs, acknowledgements); MiB: the switch's memory (--switch-mb); "
    "pool rows: aggregators of the row width; peak, mean:\naggregators in use "
    "(the switch's peak_slots, mean_slots; peak over epochs); raw/ep: rows "
    "forwarded raw, not aggregated (overflow); blocks: per exchanged layer;\n"
    "t/o: worker timeouts (fetches, resends) over all epochs; ep s: rank 0's "
    "forward+backward+grad sync, median over epochs 1..; x halo: over halo's."
)


# ------------------------------------------------------------------ checks
def _change(value: float, base: float) -> float:
    return value / base - 1


def print_checks(label: str, runs: Runs, timed: bool) -> None:
    """The formula, SwitchGNN against Straw, overflow, and (``timed``) times."""
    results = runs.results
    ul, halo = results.get("Straw-UL"), results.get("halo")
    uploads, width = runs.uploads(), runs.width()
    if ul and halo and uploads and width and runs.boundary_rows:
        measured = 1 - ul.fwd_bytes / halo.fwd_bytes
        mean_r = runs.halo_rows / runs.boundary_rows
        moved = round(halo.fwd_sent[halo.first_tag] / (4 * width))
        print(
            f"formula [{label}] Straw-UL vs halo, fwd rows: {PAPER_UL}; ours at "
            f"{runs.workers} parts: {measured:.1%} measured, {1 - 1 / mean_r:.1%} by "
            f"the formula 1 - 1/mean|R(v)|, mean|R(v)| = {runs.halo_rows:,} / "
            f"{runs.boundary_rows:,} = {mean_r:.3f} (the parts' halo / boundary rows;"
            f" the runs moved {moved:,} / {uploads:,}); fwd+bwd rows "
            f"{_change(ul.train_bytes, halo.train_bytes):+.1%} (both send back "
            "only the gradients the loss can make nonzero)"
        )
    pairs = []
    for memory in ("1MB", "10MB", "100MB", "small"):
        straw, ours = results.get(f"Straw-{memory}"), results.get(f"SwitchGNN-{memory}")
        if straw and ours:
            name = memory
            if memory == "small" and runs.small:
                name = f"small {runs.small[0]:.4g} MiB"
            pairs.append(f"{name} {_change(ours.train_bytes, straw.train_bytes):+.1%}")
    if pairs:
        print(
            f"SwitchGNN vs Straw [{label}] rows (fwd+bwd): {', '.join(pairs)}; "
            f"{PAPER_SWITCHGNN}"
        )
    straw, ours = results.get("Straw-small"), results.get("SwitchGNN-small")
    if straw and ours and runs.small:
        print(
            f"overflow [{label}] at {runs.small[0]:.4g} MiB ({runs.small[1]:,} pool "
            f"rows): Straw raw {straw.raw:,.0f} rows/ep (peak {straw.peak_slots:,}), "
            f"SwitchGNN raw {ours.raw:,.0f} (peak {ours.peak_slots:,}, blocks "
            f"{_blocks(ours)})"
        )
    if timed and halo:
        each = [
            f"{v} {results[v].epoch_s:.3f}s ({results[v].epoch_s / halo.epoch_s:.2f}x)"
            for v in TIMED
            if v in results
        ]
        print(f"time [{label}] median epoch (x halo): {', '.join(each)}")
