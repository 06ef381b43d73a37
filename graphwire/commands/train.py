"""``graphwire train``: parse, build the run's specification, run it.

Every flag comes from a field of the run specification
(:mod:`graphwire.run.spec`) or of a registered strategy's config, so
``--help`` lists what a new strategy brings and a flag that does not apply to
the run is refused, naming it (:mod:`graphwire.run.build`). ``--config FILE``
stands in for flags (a flag given on the command line wins);
``--print-spec`` prints the run's specification as YAML, which ``--config``
reads back, and stops.
"""

from __future__ import annotations

import argparse
from typing import Any

from graphwire.fullgraph.inference import ExactInference
from graphwire.fullgraph.mode import FULLGRAPH
from graphwire.minibatch.mode import minibatch_mode
from graphwire.run.build import build_spec
from graphwire.run.flags import FlagTable
from graphwire.run.spec_yaml import load_config, spec_yaml
from graphwire.run.start import start_run

__all__ = ["MODES", "add_flags", "flag_table", "given_values", "run"]

# The training modes, by --mode. A mini-batch run evaluates on the whole
# graph with the full-graph engines' exact inference.
MODES = {mode.name: mode for mode in (FULLGRAPH, minibatch_mode(ExactInference))}


def flag_table() -> FlagTable:
    """The run specification's flags, with every strategy registered now."""
    return FlagTable([mode.registry for mode in MODES.values()])


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``graphwire train``'s flags: the spec's, then the command's own; the
    table they came from rides along in the parsed arguments."""
    table = flag_table()
    table.add_to(parser)
    parser.set_defaults(flag_table=table)
    parser.add_argument("--config", help="YAML file whose keys stand in for flags")
    parser.add_argument(
        "--print-spec",
        action="store_true",
        help="print the run's specification as YAML (which --config reads) and stop",
    )


def given_values(
    table: FlagTable, args: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, str]]:
    """The values the command line and ``--config`` give, by flag dest (the
    command line wins), and the file each value from ``--config`` came from."""
    values, sources = load_config(table, args.config) if args.config else ({}, {})
    for flag in table:
        value = getattr(args, flag.dest, None)
        if value is not None:
            values[flag.dest] = value
            sources.pop(flag.dest, None)
    return values, sources


def run(args: argparse.Namespace) -> int:
    table: FlagTable = args.flag_table
    spec = build_spec(table, *given_values(table, args))
    if args.print_spec:
        print(spec_yaml(table, spec), end="", flush=True)
        return 0
    return start_run(spec, MODES[spec.mode], table)
