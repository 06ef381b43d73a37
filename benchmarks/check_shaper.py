"""Check the loopback shaper with a single TCP stream before a network benchmark.

python benchmarks/check_shaper.py [--rates 1000 200] [--seconds 1.0]

For each rate, a fresh namespace with a ``tbf`` on ``lo`` (graphwire.testing.netns);
first an unshaped namespace as the baseline. Prints the measured payload rate, its
ratio to the configured rate (a little under 1: headers), the ratio to unshaped
loopback, and the qdisc's byte counter beside the payload bytes. Needs root.
"""

from __future__ import annotations

import argparse

from graphwire.commands.bench import run_script
from graphwire.testing.netns import (
    MIN_BURST_KB,
    MIN_RATE_MBIT,
    ShapeConfig,
    ShapedNetwork,
    netns_available,
    tcp_stream,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=[1000.0, 200.0],
        help="shaped rates to check, Mbit/s, each > 0 (default 1000 200)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=1.0,
        help="how long each stream sends, > 0 (default 1)",
    )
    parser.add_argument(
        "--burst-kb",
        type=int,
        default=256,
        help=f"tbf bucket depth in KiB, at least {MIN_BURST_KB} (default 256)",
    )
    parser.add_argument(
        "--mtu", type=int, default=9000, help="lo MTU, 1280..65536 (default 9000)"
    )
    args = parser.parse_args(argv)
    # Checked before any namespace is made, naming the flag.
    if not 0 < args.seconds < float("inf"):
        parser.error(f"--seconds: expected a number > 0, got {args.seconds}")
    if bad := [r for r in args.rates if not MIN_RATE_MBIT <= r < float("inf")]:
        parser.error(
            f"--rates: expected numbers >= {MIN_RATE_MBIT} (tc's 1 kbit/s), got {bad}"
        )
    try:
        ShapeConfig(rate_mbit=None, burst_kb=args.burst_kb, mtu=args.mtu)
    except ValueError as error:  # "burst_kb: ..." or "mtu: ..."
        parser.error(f"--{str(error).replace('_', '-', 1)}")

    ok, reason = netns_available()
    if not ok:
        raise SystemExit(
            f"check_shaper: needs network namespaces (run as root): {reason}"
        )

    header = (
        f"{'link':<14}{'Mbit/s':>10}{'measured':>11}{'/configured':>13}"
        f"{'/unshaped':>11}{'payload B':>14}{'qdisc B':>14}{'qdisc/payload':>15}"
    )
    print(header)
    print("-" * len(header))
    unshaped = 0.0
    for rate in [None, *args.rates]:
        with ShapedNetwork(rate_mbit=rate, burst_kb=args.burst_kb, mtu=args.mtu) as net:
            before = net.qdisc_bytes()
            result = tcp_stream(net, args.seconds)
            qdisc = net.qdisc_bytes() - before
        mbit = result.mbit_per_s
        if rate is None:
            unshaped = mbit
            print(
                f"{'unshaped lo':<14}{'-':>10}{mbit:>11.0f}{'-':>13}{1.0:>11.3f}"
                f"{result.num_bytes:>14,}{'-':>14}{'-':>15}"
            )
            continue
        print(
            f"{f'tbf {rate:g}':<14}{rate:>10g}{mbit:>11.0f}{mbit / rate:>13.3f}"
            f"{mbit / unshaped:>11.3f}{result.num_bytes:>14,}{qdisc:>14,}"
            f"{qdisc / result.num_bytes:>15.4f}"
        )
        if mbit < 0.9 * rate:
            # The stream could not fill the link: the host, not tbf, is the limit.
            print(f"  ! below {rate:g} Mbit/s: CPU-bound here, not shaped")
    print(
        f"\n1 TCP stream, {args.seconds:g} s each, lo MTU {args.mtu}, "
        f"burst {args.burst_kb} KiB; measured = receiver payload rate."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
