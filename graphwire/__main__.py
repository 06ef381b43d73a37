"""``python -m graphwire`` (and ``torchrun -m graphwire``) runs the CLI."""

import os

from graphwire.cli import main

code = main()
if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
    # A launcher's worker (torchrun): end it as graphwire's own workers end.
    from graphwire.comm.launch import exit_now

    exit_now(code)
raise SystemExit(code)
