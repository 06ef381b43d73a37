"""Sampler throughput on the 1M-node synthetic graph: sampled edges/s/thread.

python benchmarks/bench_sampler.py [--nodes 1000000]
"""

from graphwire.commands.bench import script_main

if __name__ == "__main__":
    raise SystemExit(script_main("sampler"))
