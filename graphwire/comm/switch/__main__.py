"""``python -m graphwire.comm.switch --listen HOST:PORT [--parent-pid PID]``.

The switch as :func:`~graphwire.comm.switch.server.start_switch` starts it:
the same as ``graphwire switch`` without the command line's imports."""

import argparse

from graphwire.comm.switch.server import die_with, parse_address, serve

parser = argparse.ArgumentParser(prog="python -m graphwire.comm.switch")
parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
parser.add_argument("--parent-pid", type=int)
args = parser.parse_args()
host, port = parse_address(args.listen)
if args.parent_pid is not None:
    die_with(args.parent_pid)
raise SystemExit(serve(host, port))
