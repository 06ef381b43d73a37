"""Full-graph GCN epoch on the 1M-node synthetic graph: graphwire vs torch.sparse.mm.

python benchmarks/bench_gcn_epoch.py [--nodes 1000000]
"""

from graphwire.commands.bench import script_main

if __name__ == "__main__":
    raise SystemExit(script_main("gcn-epoch"))
