"""What the shaped-network benchmarks share (``bench_fullgraph``,
``bench_minibatch``): running ``graphwire`` commands inside a namespace and
reading their records, the synthetic graph and its parts, the shaper check,
the common flags, the work folder and the ``--json`` figures.

benchmarks/ is not a package: the scripts put this folder on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from graphwire.comm.context import MAX_TIMEOUT_S
from graphwire.fsutil import atomic_file, check_creatable
from graphwire.testing.netns import MIN_RATE_MBIT, ShapedNetwork, tcp_stream

__all__ = [
    "CLI",
    "TIMEOUTS",
    "RunFailed",
    "add_graph_flags",
    "add_run_flags",
    "check_flags",
    "cli",
    "comma_list",
    "worker_counts",
    "epoch_records",
    "in_work_folder",
    "kill_namespace_processes",
    "prepare_graph",
    "qdisc_drops",
    "shaper_check",
    "summary_fields",
    "take_sizes",
    "train_run",
    "train_runs",
    "write_figures",
]

CLI = [sys.executable, "-m", "graphwire"]


class RunFailed(RuntimeError):
    """A ``graphwire`` command exited non-zero or ran past its time limit."""


# ------------------------------------------------------------------ running
def cli(argv: list[str], timeout_s: float) -> str:
    """Run a ``graphwire`` command outside any namespace; its stdout."""
    command = [*CLI, *argv]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as error:
        raise RunFailed(f"`{' '.join(command)}` ran past {timeout_s:.0f}s") from error
    if done.returncode != 0:
        raise RunFailed(
            f"`{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    return done.stdout


def kill_namespace_processes(net: ShapedNetwork, grace_s: float = 2.0) -> None:
    """SIGTERM every process in ``net`` (all started by us), then SIGKILL, by PID."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in net.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while net.pids() and time.monotonic() < deadline:
            time.sleep(0.05)


def train_run(
    net: ShapedNetwork, argv: list[str], out: Path, timeout_s: float
) -> tuple[dict[str, str], float]:
    """``graphwire train ARGV --out OUT`` inside ``net``: summary fields, wall s."""
    return train_runs(net, [argv], [out], timeout_s)[0]


def train_runs(
    net: ShapedNetwork, argvs: list[list[str]], outs: list[Path], timeout_s: float
) -> list[tuple[dict[str, str], float]]:
    """``graphwire train ARGV --out OUT`` for each pair, all started at once
    inside ``net`` (which must run nothing else): each one's summary fields and
    wall seconds. Past ``timeout_s`` every process in ``net`` is killed; the
    first run that failed is raised once all have ended."""
    commands = [
        [*CLI, "train", *argv, "--out", str(out)]
        for argv, out in zip(argvs, outs, strict=True)
    ]
    start = time.perf_counter()
    codes: list[int | None] = []
    walls: list[float] = []  # until its end was seen (runs are waited in order)
    try:
        running = []
        for command, out in zip(commands, outs, strict=True):
            out.mkdir(parents=True, exist_ok=True)
            with (
                open(out / "stdout.txt", "w") as stdout,
                open(out / "stderr.txt", "w") as err,
            ):
                running.append(net.popen(command, stdout=stdout, stderr=err))
        for proc in running:
            remaining = max(0.0, start + timeout_s - time.perf_counter())
            try:
                codes.append(proc.wait(timeout=remaining))
            except subprocess.TimeoutExpired:
                codes.append(None)
                kill_namespace_processes(net)  # the others are past the limit too
                proc.wait()
            walls.append(time.perf_counter() - start)
    finally:  # also when a start fails or the wait is interrupted
        if net.pids():  # workers left behind by a parent that exited
            kill_namespace_processes(net)
    return [
        _summary(command, out, code, wall, timeout_s)
        for command, out, code, wall in zip(commands, outs, codes, walls, strict=True)
    ]


def _summary(
    command: list[str], out: Path, code: int | None, wall: float, timeout_s: float
) -> tuple[dict[str, str], float]:
    """One ended run's summary fields and wall seconds, or RunFailed."""
    stderr = (out / "stderr.txt").read_text(errors="replace")
    if code is None:
        raise RunFailed(
            f"`{' '.join(command)}` ran past {timeout_s:.0f}s (killed); stderr "
            f"tail:\n{stderr[-3000:]}"
        )
    if code != 0:
        raise RunFailed(f"`{' '.join(command)}` exited {code}:\n{stderr[-3000:]}")
    stdout = (out / "stdout.txt").read_text()
    return summary_fields(stdout, f"`{' '.join(command)}`"), wall


def summary_fields(stdout: str, what: str) -> dict[str, str]:
    """The fields of a ``graphwire train`` run's last line, ``summary
    key=value ...``; RunFailed naming ``what`` if that line is not one."""
    lines = stdout.strip().splitlines()
    last = lines[-1] if lines else ""
    if not last.startswith("summary "):
        raise RunFailed(f"{what}: no summary line (last: {last!r})")
    return dict(pair.split("=", 1) for pair in last.split()[1:])


def epoch_records(out: Path) -> dict[int, list[dict[str, Any]]]:
    """Rank -> its epoch records from ``OUT/metrics.jsonl``, in epoch order."""
    ranks: dict[int, list[dict[str, Any]]] = {}
    with open(out / "metrics.jsonl") as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("kind") == "epoch":
                ranks.setdefault(int(record.get("rank", 0)), []).append(record)
    for records in ranks.values():
        records.sort(key=lambda r: int(r["epoch"]))
    return ranks


def prepare_graph(
    args: argparse.Namespace, work: Path, jobs: list[tuple[str, int, str]]
) -> None:
    """Generate the products-like graph (``args.nodes``, ``args.features``)
    into ``work/graph`` and partition it once per ``(method, parts, folder)``,
    so no run's time includes either."""
    spec = (
        f"synthetic:products?nodes={args.nodes}&degree=20&features={args.features}"
        "&classes=47&seed=0"
    )
    start = time.perf_counter()
    cli(["data", "generate", "--dataset", spec, "--out", str(work / "graph")], 3600)
    print(f"generated {spec} in {time.perf_counter() - start:.1f}s", flush=True)
    # The parts' node order (``--node-order``, where the benchmark has it;
    # else partition's default).
    order = getattr(args, "node_order", None)
    ordered = ["--node-order", order] if order else []
    for method, parts, folder in jobs:
        start = time.perf_counter()
        cli(
            ["partition", "--dataset", str(work / "graph"), "--method", method]
            + ["--parts", str(parts), "--out", str(work / folder), *ordered],
            3600,
        )
        print(
            f"partitioned with {method} into {parts} parts in "
            f"{time.perf_counter() - start:.1f}s",
            flush=True,
        )


def shaper_check(net: ShapedNetwork, rate: float) -> None:
    before = net.qdisc_bytes()
    stream = tcp_stream(net, 2.0)
    qdisc = net.qdisc_bytes() - before
    mbit = stream.mbit_per_s
    print(
        f"shaper: one TCP stream {mbit:.0f} Mbit/s measured vs {rate:g} configured "
        f"({mbit / rate:.3f}x); qdisc {qdisc:,} B for {stream.num_bytes:,} B "
        f"payload ({qdisc / stream.num_bytes:.4f})",
        flush=True,
    )
    if mbit < 0.9 * rate:
        print(f"  ! below 0.9 x {rate:g} Mbit/s: the host, not tbf, limits the link")
    if mbit > 1.05 * rate:
        print(f"  ! above {rate:g} Mbit/s: the shaper is not limiting")


def qdisc_drops(net: ShapedNetwork) -> str:
    """The root qdisc's drop and overlimit counters, as ``tc -s`` prints them."""
    done = net.run(
        [shutil.which("tc") or "tc", "-s", "qdisc", "show", "dev", "lo"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    match = re.search(r"\(dropped \d+, overlimits \d+", done.stdout)
    return match.group(0).lstrip("(") if match else done.stdout.strip()


TIMEOUTS = ("run_timeout", "collective_timeout")


def add_graph_flags(parser: argparse.ArgumentParser) -> None:
    """The synthetic graph's flags, ``--nodes`` and ``--features`` (both
    shaped benchmarks take them)."""
    parser.add_argument(
        "--nodes",
        type=int,
        help="nodes of the synthetic products-like graph (degree 20; default "
        "200000, --quick 20000)",
    )
    parser.add_argument(
        "--features", type=int, default=100, help="input features F (default 100)"
    )


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags both shaped benchmarks take for their runs: each run's and
    each collective's time bound, ``--quick`` and ``--keep``."""
    parser.add_argument(
        "--run-timeout",
        type=float,
        default=1800.0,
        help="seconds one training run may take before it is killed and "
        "reported as failed (default 1800)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=600.0,
        help="seconds any collective may wait (train --timeout; default 600)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small smoke run: 20000 nodes, 3 epochs, 1 round unless "
        "--nodes, --epochs, --rounds say otherwise",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary work folder (graph, parts, every run's output)",
    )


def take_sizes(
    args: argparse.Namespace, full: dict[str, int], quick: dict[str, int]
) -> None:
    """Fill the run sizes the command line left unset (None) from ``full``,
    or from ``quick`` under ``--quick``."""
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def check_flags(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    minimums: dict[str, int],
    positive: tuple[str, ...],
) -> None:
    """Exit with a usage error naming the first flag below its minimum (an
    integer flag), not above 0 (``positive``, a float flag) or a --json PATH
    that cannot be written (else found after the runs); unset flags pass."""
    if args.json is not None:
        try:
            check_creatable(args.json, f"--json {args.json}", file=True)
        except ValueError as error:
            parser.error(str(error))
    for name, least in minimums.items():
        value = getattr(args, name)
        if value is not None and value < least:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag}: expected an integer >= {least}, got {value}")
    for name in positive:
        value = getattr(args, name)
        if value is not None and not 0 < value < float("inf"):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag}: expected a number > 0, got {value}")
    timeout = getattr(args, "collective_timeout", None)
    if timeout is not None and timeout > MAX_TIMEOUT_S:
        parser.error(
            f"--collective-timeout: expected <= {MAX_TIMEOUT_S:g} (train's "
            f"--timeout), got {timeout}"
        )
    rate = getattr(args, "rate_mbit", None) if "rate_mbit" in positive else None
    if rate is not None and rate < MIN_RATE_MBIT:
        parser.error(
            f"--rate-mbit: expected >= {MIN_RATE_MBIT} (tc's 1 kbit/s), got {rate}"
        )


def in_work_folder(
    prefix: str,
    args: argparse.Namespace,
    bench: Any,
) -> int:
    """``bench(args, work, started)`` in a fresh temporary folder, removed
    afterwards unless ``args.keep``; prints the load average first."""
    started = time.perf_counter()
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        result: int = bench(args, work, started)
        return result
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def write_figures(path: str, payload: dict[str, Any]) -> None:
    """``payload`` to --json ``path``, atomically, its folder made if need be."""
    with atomic_file(path) as handle:
        handle.write(json.dumps(payload, indent=1))


def comma_list(
    parser: argparse.ArgumentParser, flag: str, text: str, kind: type
) -> list:
    """``text`` (``"2,4"``) as a list of ``kind``; refused through ``parser``,
    naming ``flag``, if an item is not one."""
    try:
        return [kind(item) for item in text.split(",")]
    except ValueError:
        parser.error(f"{flag}: expected {kind.__name__}s separated by commas: {text}")


def worker_counts(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """``--workers`` (``"2,4"``): distinct worker counts, each >= 2; refused
    through ``parser`` otherwise."""
    counts = comma_list(parser, "--workers", text, int)
    if any(w < 2 for w in counts) or len(set(counts)) < len(counts):
        parser.error(f"--workers: expected distinct integers >= 2, got {counts}")
    return counts
