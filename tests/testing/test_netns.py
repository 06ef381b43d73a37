"""`ShapedNetwork`: namespaces are always removed, their processes always killed,
and the shaper really limits a TCP stream.

The throughput tests check the kernel's shaper, not the speed of our code: each
compares a shaped stream with an unshaped one measured in the same test, with
wide margins. Tests that need a namespace skip with `netns_available`'s reason.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

import graphwire.testing.netns.cleanup as cleanup_module
import graphwire.testing.netns.network as network_module
from graphwire.sigterm import STOP_SIGNALS
from graphwire.testing.netns import (
    ShapeConfig,
    ShapedNetwork,
    measure_tcp_throughput,
    netns_available,
    tcp_stream,
)
from tests.signals import default_stop_signals

STREAM_S = 0.4  # long enough for TCP to ramp up, short enough for CI


@pytest.fixture
def netns() -> None:
    ok, reason = netns_available()
    if not ok:
        pytest.skip(f"network namespaces unavailable: {reason}")


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def alive(pid: int) -> bool:
    """Running, not a zombie (PID 1 may not reap re-parented grandchildren)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def py(net: ShapedNetwork, script: str, **kwargs: object) -> subprocess.Popen[str]:
    """Start ``python -c script`` inside ``net``, stdout piped as text."""
    return net.popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, **kwargs
    )


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"burst_kb": 64}, "burst_kb"),
        ({"rate_mbit": 0}, "rate_mbit"),
        ({"mtu": 500}, "mtu"),
        ({"per_address": {"10.0.0.2": 100}}, "per_address"),
        ({"per_address": {"127.0.0.2": -1}}, "per_address"),
        ({"rate_mbit": 0.0004}, "rate_mbit: expected >= 0.001"),  # tc: 0kbit
        ({"per_address": {"127.0.0.2": 0.0004}}, "per_address"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ShapeConfig(**kwargs)


# ------------------------------------------------------------------ lifecycle
def test_namespace_is_set_up_and_removed(netns: None) -> None:
    with ShapedNetwork(rate_mbit=200, burst_kb=256, mtu=9000) as net:
        assert net.name.startswith(f"gw-{os.getpid()}-")
        assert net.name in namespaces()
        link = net.run(["ip", "link", "show", "lo"], capture_output=True, text=True)
        assert "mtu 9000" in link.stdout and "UP" in link.stdout
        qdisc = net.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True)
        assert b"tbf" in qdisc.stdout and b"rate 200Mbit" in qdisc.stdout
    assert net.name not in namespaces()
    net.close()  # idempotent


def test_names_are_unique(netns: None) -> None:
    with ShapedNetwork() as a, ShapedNetwork() as b:
        assert a.name != b.name
        assert {a.name, b.name} <= namespaces()
    assert not {a.name, b.name} & namespaces()


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_namespace_removed_when_body_raises(
    netns: None, error: type[BaseException]
) -> None:
    with pytest.raises(error), ShapedNetwork() as net:
        proc = py(net, "import time; time.sleep(60)")
        raise error("boom")
    assert net.name not in namespaces()
    assert proc.returncode is not None


def test_processes_inside_are_killed_at_exit(netns: None) -> None:
    spawner = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    with ShapedNetwork(grace_s=0.3) as net:
        parent = py(net, spawner)
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        holdout = py(net, stubborn)
        assert holdout.stdout is not None
        assert holdout.stdout.readline().strip() == "ready"
        assert {parent.pid, grandchild, holdout.pid} <= set(net.pids())
    assert parent.returncode == -15  # SIGTERM
    assert holdout.returncode == -9  # ignored SIGTERM, got SIGKILL
    assert not alive(grandchild)  # not started by popen, found in the namespace


def test_an_interrupt_while_the_namespace_is_made_removes_it(
    netns: None, monkeypatch
) -> None:
    """Ctrl-C or SIGTERM while ``ip netns add`` runs: subprocess lets the
    command finish, so the namespace exists when KeyboardInterrupt arrives.
    It was made live only afterwards, so nothing removed it."""
    real_run = network_module.run_or_raise

    def interrupted(argv: list[str]) -> str:
        out = real_run(argv)
        if argv[1:3] == ["netns", "add"]:
            raise KeyboardInterrupt("signal 15")
        return out

    monkeypatch.setattr(network_module, "run_or_raise", interrupted)
    net = ShapedNetwork()
    with pytest.raises(KeyboardInterrupt), net:
        pass
    assert net.name not in namespaces()
    assert net.name not in cleanup_module.LIVE


def test_an_interrupt_in_the_grace_period_still_kills_what_ignores_sigterm(
    netns: None, monkeypatch
) -> None:
    """A second Ctrl-C while close() waits for SIGTERMed processes cut the
    wait short and skipped the SIGKILL: a process ignoring SIGTERM outlived
    its namespace."""
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    net = ShapedNetwork(grace_s=30).__enter__()
    holdout = py(net, stubborn)
    assert holdout.stdout is not None
    assert holdout.stdout.readline().strip() == "ready"

    real_sleep, calls = time.sleep, []

    def interrupt(seconds: float) -> None:
        calls.append(seconds)
        if seconds == 0.02 and calls.count(0.02) == 1:  # the grace loop's first
            raise KeyboardInterrupt("signal 2")
        real_sleep(seconds)

    monkeypatch.setattr(cleanup_module.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        net.close()
    monkeypatch.undo()
    assert holdout.returncode == -9
    assert net.name not in namespaces()


def test_popen_needs_a_live_namespace(netns: None) -> None:
    net = ShapedNetwork()
    with pytest.raises(RuntimeError, match="not live"):
        net.popen(["true"])


# ------------------------------------------------------------------ shaping
def test_shaper_limits_a_tcp_stream(netns: None) -> None:
    rate = 200.0
    with ShapedNetwork(rate_mbit=None) as net:
        unshaped = measure_tcp_throughput(net, STREAM_S)
        assert net.qdisc_bytes() == 0  # noqueue: nothing to count
    with ShapedNetwork(rate_mbit=rate) as net:
        before = net.qdisc_bytes()
        shaped = tcp_stream(net, STREAM_S)
        sent = net.qdisc_bytes() - before
    assert shaped.mbit_per_s < 1.3 * rate, (shaped, unshaped)
    assert shaped.mbit_per_s > 0.3 * rate, "shaped link drops too much"
    assert unshaped > 2 * rate and unshaped > 2 * shaped.mbit_per_s
    # Every payload byte crosses lo's qdisc once, plus headers and ACKs (~1%).
    assert shaped.num_bytes <= sent <= 1.05 * shaped.num_bytes + (1 << 20)


def test_per_address_classes_shape_traffic_to_each_address(netns: None) -> None:
    slow, fast = "127.0.0.2", "127.0.0.3"
    with ShapedNetwork(rate_mbit=None, per_address={slow: 100, fast: 400}) as net:
        to_slow = tcp_stream(net, STREAM_S, address=slow)
        to_fast = tcp_stream(net, STREAM_S, address=fast)
        by_address = net.address_bytes()
    assert to_slow.mbit_per_s < 1.3 * 100
    assert to_fast.mbit_per_s > 1.5 * to_slow.mbit_per_s
    assert to_slow.num_bytes <= by_address[slow] <= 1.05 * to_slow.num_bytes + 2**20
    assert to_fast.num_bytes <= by_address[fast] <= 1.05 * to_fast.num_bytes + 2**20


# ------------------------------------------------------------------ gloo
# What the training benchmarks do: torch.distributed gloo workers inside the
# namespace, rendezvous on 127.0.0.1.
GLOO_ALL_REDUCE = """
import datetime, os
import torch
import torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group(
    "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30)
)
t = torch.full((1 << 16,), float(rank + 1))
dist.all_reduce(t)
assert torch.all(t == 3.0), t[:4]
dist.destroy_process_group()
print("ok", flush=True)
"""


@pytest.mark.slow
def test_gloo_all_reduce_inside_namespace(netns: None) -> None:
    with ShapedNetwork(rate_mbit=1000) as net:
        before = net.qdisc_bytes()
        workers = []
        for rank in range(2):
            env = dict(
                os.environ,
                RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT="29500",  # the namespace is new: every port is free
                GLOO_SOCKET_IFNAME="lo",
            )
            workers.append(py(net, GLOO_ALL_REDUCE, env=env, stderr=subprocess.STDOUT))
        outputs = [w.communicate(timeout=120)[0] for w in workers]
        sent = net.qdisc_bytes() - before
    for rank, (w, out) in enumerate(zip(workers, outputs, strict=True)):
        assert w.returncode == 0, f"rank {rank} exited {w.returncode}:\n{out}"
        assert out.strip().endswith("ok")
    # A 2-rank all-reduce moves the 256 KiB tensor once in each direction.
    assert sent >= 2 * (1 << 16) * 4


_STORE = """
{first}
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
client.set("k", "v")
"""


def test_a_launcher_in_a_namespace_prints_no_c10d_warning(netns: None) -> None:
    """Every run inside a namespace printed ``[c10d] The hostname of the
    client socket cannot be retrieved`` from the rendezvous store its
    launcher hosts (no name resolves there); the ``graphwire`` command's
    own C++ log is at ERROR, and a bare torch, the control, still warns."""
    with ShapedNetwork(rate_mbit=None) as net:
        said = {}
        for first in ("import graphwire.cli", "import torch"):
            code = _STORE.format(first=first)
            done = net.run([sys.executable, "-c", code], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            said[first] = done.stderr
    if "[c10d]" not in said["import torch"]:
        pytest.skip("names resolve in this namespace: torch does not warn")
    assert "[c10d]" not in said["import graphwire.cli"], said


_TERMINATED = """
import sys, time
from graphwire.testing.netns import ShapedNetwork
with ShapedNetwork(rate_mbit=100) as net:
    sleeper = net.popen(["sleep", "200"])
    print(net.name, sleeper.pid, flush=True)
    time.sleep(60)
"""


def test_namespace_removed_when_its_process_gets_sigterm_or_sighup(
    netns: None,
) -> None:
    """SIGTERM's default (``timeout``, ``kill PID``) and SIGHUP's (the
    terminal closed) ended the process with no clean-up: its namespace
    stayed, and the processes in it ran on. One process per signal, at
    once."""
    procs = {
        stop: subprocess.Popen(
            [sys.executable, "-c", _TERMINATED],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=default_stop_signals,
        )
        for stop in STOP_SIGNALS
    }
    made: dict[signal.Signals, tuple[str, int]] = {}
    try:
        for stop, proc in procs.items():
            assert proc.stdout is not None
            name, pid_text = proc.stdout.readline().split()
            made[stop] = name, int(pid_text)
        for stop, proc in procs.items():
            proc.send_signal(stop)
        for stop, proc in procs.items():
            proc.wait(timeout=60)
            name, pid = made[stop]
            assert name not in namespaces(), stop.name
            assert not alive(pid), stop.name
    finally:  # the namespaces and the sleepers, should the fix fail
        for proc in procs.values():
            if proc.poll() is None:  # one not yet stopped may remove its own
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        left = namespaces()
        for name, pid in made.values():
            if name in left:
                subprocess.run(["ip", "netns", "del", name], check=False)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("stop", STOP_SIGNALS, ids=lambda s: s.name)
def test_a_stop_signal_gets_its_default_back_when_the_namespace_goes(
    netns: None, stop: signal.Signals
) -> None:
    previous = signal.signal(stop, signal.SIG_DFL)
    try:
        with ShapedNetwork():
            assert signal.getsignal(stop) is not signal.SIG_DFL
        assert signal.getsignal(stop) is signal.SIG_DFL
    finally:
        signal.signal(stop, previous)


def test_an_ignored_sighup_stays_ignored_while_a_namespace_lives(
    netns: None,
) -> None:
    """Under ``nohup`` SIGHUP is ignored, so that the run outlives its
    terminal: a namespace must not make it interrupt the run."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with ShapedNetwork():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
