"""Test harnesses: :func:`run_workers` runs a function on N gloo processes.

Importing this package is cheap and has no side effects; submodules such as
``netns`` (shaped network namespaces) are imported on their own.
"""

from graphwire.testing.workers import run_workers

__all__ = ["run_workers"]
