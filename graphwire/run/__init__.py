"""What the full-graph and mini-batch loops share: the run specification and
its strategy registries, job start, checkpoints, per-epoch records, reports."""
