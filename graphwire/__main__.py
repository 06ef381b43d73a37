"""``python -m graphwire`` (and ``torchrun -m graphwire``) runs the CLI."""

from graphwire.cli import main
from graphwire.comm.context import under_torchrun

code = main()
if under_torchrun():
    # A launcher's worker: end it as graphwire's own workers end.
    from graphwire.comm.launch import exit_now

    exit_now(code)
raise SystemExit(code)
