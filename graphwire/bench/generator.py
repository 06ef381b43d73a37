"""Generator benchmark: time and peak memory of the synthetic products graph.

The generation runs in a fresh child process so its peak resident memory is its
own; the peak is reported as a ratio to the size of the graph it returns
(CSR + features + labels + splits), beside the 1-minute / 3x targets.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

from graphwire.bench.registry import BenchOptions, target_note

_CHILD = r"""
import json, resource, sys, time
import torch
from graphwire.graph.synthetic import ProductsConfig, products_graph
torch.set_num_threads(1)
nodes, seed = int(sys.argv[1]), int(sys.argv[2])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
graph = products_graph(ProductsConfig(nodes=nodes, degree=20, features=100, seed=seed))
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
arrays = [graph.indptr, graph.indices, graph.x, graph.y,
          graph.train_idx, graph.val_idx, graph.test_idx]
output = sum(a.numel() * a.element_size() for a in arrays)
print(json.dumps(dict(nodes=graph.num_nodes, edges=graph.num_edges,
    seconds=seconds, output_bytes=output, peak_bytes=peak - base,
    baseline_bytes=base)))
"""


class GeneratorFailed(RuntimeError):
    """The process generating the graph failed.

    The message says how: its error's last line, or the signal that killed it."""


def run(options: BenchOptions) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(options.nodes), str(options.seed)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise GeneratorFailed(
            f"generator: generating {options.nodes:,} nodes failed: {_why(out)}"
        )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["peak_over_output"] = result["peak_bytes"] / result["output_bytes"]
    print(
        f"generator: {result['nodes']:,} nodes, {result['edges']:,} directed edges, "
        f"F=100 in {result['seconds']:.1f}s (target < 60s); peak memory above the "
        f"interpreter baseline = {result['peak_over_output']:.2f}x the output "
        f"({result['output_bytes'] / 2**20:.0f} MiB; target < 3x"
        f"{target_note(options)})"
    )
    return result


def _why(out: subprocess.CompletedProcess[str]) -> str:
    """The failed child's error in a line: its last line on stderr, or the
    signal that ended it (SIGKILL: most likely the kernel's out-of-memory
    killer)."""
    if out.returncode < 0:
        name = signal.Signals(-out.returncode).name
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    lines = out.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {out.returncode}"
