"""A restarted group joins on the store of the attempt before.

torchrun's agent keeps one rendezvous store for all the attempts of a run
(``--max-restarts``). A restarted rank that read the addresses its peers'
killed predecessors had published there tried them, was refused, and the
restart failed, or not, as the ranks happened to start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta

import torch.distributed as dist

from graphwire.comm.launch import free_port

# Attempt 0's rank 1 dies once the group is up, as a worker killed mid-run.
_RANK = textwrap.dedent(
    """
    import os
    import time

    from graphwire.comm.context import WorkerContext
    from graphwire.comm.dist import TorchTransport

    transport = TorchTransport.open(WorkerContext.from_env(timeout_s=30))
    print(transport.all_gather_object(transport.rank, "ranks"), flush=True)
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and transport.rank == 1:
        os._exit(3)
    time.sleep(1.0)
    transport.close()
    """
)


def _start(rank: int, port: int, attempt: int) -> subprocess.Popen:
    """Rank ``rank`` of 2 as torchrun starts it in attempt ``attempt``."""
    env = os.environ | {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
    }
    return subprocess.Popen(
        [sys.executable, "-c", _RANK],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(ranks: list[subprocess.Popen]) -> list[tuple[int, str]]:
    """Each rank's exit status and output, once it has ended."""
    said = []
    for process in ranks:
        try:
            out, err = process.communicate(timeout=120)
        finally:
            process.kill()  # only if still running: it is ours, by its handle
        said.append((process.returncode, out.strip() or err[-3000:]))
    return said


def test_a_restarted_group_joins_on_the_store_of_the_attempt_before() -> None:
    """Attempt 0's rank 1 dies; both are started again on the same store
    (torchrun's restart). Before, attempt 1's ranks joined through the
    addresses attempt 0's had left in the store: gloo's connect was
    refused (rank 0 tried the dead rank 1's port) and the restart failed."""
    port = free_port()
    store = dist.TCPStore(  # noqa: F841 (the agent's: lives as long as it)
        "127.0.0.1",
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )
    first = _finish([_start(0, port, 0), _start(1, port, 0)])
    assert first == [(0, "[0, 1]"), (3, "[0, 1]")]
    assert _finish([_start(0, port, 1), _start(1, port, 1)]) == [(0, "[0, 1]")] * 2
