"""Test harnesses: :func:`run_workers` runs a function on N gloo processes.

Importing this package is cheap and has no side effects; submodules such as
``netns`` (shaped network namespaces) are imported on their own.
"""

from graphwire.testing.workers import WorkerFailed, run_workers

__all__ = ["WorkerFailed", "run_workers"]
