"""``python -m graphwire`` (and ``torchrun -m graphwire``) runs the CLI."""

from graphwire.cli import main

raise SystemExit(main())
