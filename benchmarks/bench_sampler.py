"""Sampler throughput on the 1M-node synthetic graph: sampled edges/s/thread.

python benchmarks/bench_sampler.py [--nodes 1000000]
"""

from graphwire.cli import main

if __name__ == "__main__":
    import sys

    raise SystemExit(main(["bench", "sampler", *sys.argv[1:]]))
