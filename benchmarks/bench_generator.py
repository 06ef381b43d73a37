"""Synthetic generator: 1M nodes / ~20M edges / F=100, time and peak memory.

python benchmarks/bench_generator.py [--nodes 1000000]
"""

from graphwire.cli import main

if __name__ == "__main__":
    import sys

    raise SystemExit(main(["bench", "generator", *sys.argv[1:]]))
