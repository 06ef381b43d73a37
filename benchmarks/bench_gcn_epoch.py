"""Full-graph GCN epoch on the 1M-node synthetic graph: graphwire vs torch.sparse.mm.

python benchmarks/bench_gcn_epoch.py [--nodes 1000000]
"""

from graphwire.cli import main

if __name__ == "__main__":
    import sys

    raise SystemExit(main(["bench", "gcn-epoch", *sys.argv[1:]]))
