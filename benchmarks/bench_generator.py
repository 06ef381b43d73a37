"""Synthetic generator: 1M nodes / ~20M edges / F=100, time and peak memory.

python benchmarks/bench_generator.py [--nodes 1000000]
"""

from graphwire.commands.bench import script_main

if __name__ == "__main__":
    raise SystemExit(script_main("generator"))
