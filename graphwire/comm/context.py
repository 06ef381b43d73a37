"""`WorkerContext`: who this process is in a run, read once and passed around.

``torchrun`` (and :func:`graphwire.comm.launch.launch_local`, which imitates it)
describes each worker with environment variables; :meth:`WorkerContext.from_env`
reads them in one place and nothing else in graphwire looks at them. Importing
this module has no side effects: CUDA is only queried when a context is built.

Example::

    ctx = WorkerContext.from_env()          # RANK, WORLD_SIZE, LOCAL_RANK, ...
    transport = TorchTransport.open(ctx)    # graphwire.comm.dist
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch

__all__ = [
    "BACKENDS",
    "DEFAULT_STALL_NOTICE_S",
    "DEFAULT_TIMEOUT_S",
    "MAX_TIMEOUT_S",
    "WorkerContext",
    "default_backend",
    "restart_attempt",
    "under_torchrun",
    "usable_cores",
]

BACKENDS = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_STALL_NOTICE_S = 30.0
# The longest timeout (about 31 years): a datetime.timedelta holds it, and
# torch.distributed takes it.
MAX_TIMEOUT_S = 1e9

_REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_INTS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")


def under_torchrun() -> bool:
    """True when torchrun (or another launcher) set this process's rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, which a job
    scheduler or ``taskset`` may narrow; else the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def restart_attempt() -> int:
    """Which attempt of a torchrun run this is (``--max-restarts``: 0 for
    the first, as without torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def default_backend(local_ranks: int = 1) -> str:
    """The backend for ``local_ranks`` ranks on this machine: NCCL or gloo.

    ``"nccl"`` where this machine has a CUDA device for each of its
    ``local_ranks`` ranks (NCCL drives one GPU per rank), else ``"gloo"``: a
    single-GPU machine runs several workers over gloo rather than not at all."""
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_ranks
    return "nccl" if cuda else "gloo"


@dataclass(frozen=True, slots=True)
class WorkerContext:
    """One worker's place in a run.

    Attributes:
        rank: this worker's rank, in ``[0, world_size)``.
        world_size: number of workers in the run.
        local_rank: rank among the workers of this machine (picks the GPU).
        master_addr: host of rank 0's rendezvous store.
        master_port: port of that store.
        backend: ``"gloo"`` (CPU tensors) or ``"nccl"`` (GPU tensors).
        timeout_s: bound on every blocking collective and on the rendezvous.
        stall_notice_s: how long a blocking call waits before the rank says
            which rank it waits on (:mod:`~graphwire.comm.stall`); 0: never.
        local_world_size: the workers on this machine (torchrun's
            ``LOCAL_WORLD_SIZE``); None where the launcher did not say.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    backend: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    stall_notice_s: float = DEFAULT_STALL_NOTICE_S
    local_world_size: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size: expected >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank: expected 0 <= rank < {self.world_size}, got {self.rank}"
            )
        if not 0 <= self.local_rank < self.world_size:
            raise ValueError(
                f"local_rank: expected 0 <= local_rank < {self.world_size} (the "
                f"world size), got {self.local_rank}"
            )
        local_world = self.local_world_size
        if local_world is not None and not 1 <= local_world <= self.world_size:
            raise ValueError(
                f"local_world_size: expected 1 <= local_world_size <= "
                f"{self.world_size} (the world size), got {local_world}"
            )
        if not self.master_addr:
            raise ValueError("master_addr: expected a host name or address, got ''")
        if _has_port(self.master_addr):
            raise ValueError(
                f"master_addr: expected a host name or address without a port "
                f"(the port is master_port), got {self.master_addr!r}"
            )
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port: expected 1..65535, got {self.master_port}")
        if self.backend not in BACKENDS:
            raise ValueError(
                f"backend: expected one of {BACKENDS}, got {self.backend!r}"
            )
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(
                f"timeout_s: expected > 0 and <= {MAX_TIMEOUT_S:g}, "
                f"got {self.timeout_s}"
            )
        if not 0 <= self.stall_notice_s <= MAX_TIMEOUT_S:
            raise ValueError(
                f"stall_notice_s: expected >= 0 and <= {MAX_TIMEOUT_S:g}, "
                f"got {self.stall_notice_s}"
            )

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] = os.environ,
        *,
        backend: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        stall_notice_s: float = DEFAULT_STALL_NOTICE_S,
    ) -> WorkerContext:
        """Read the variables ``torchrun`` sets.

        Args:
            env: where to read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
                ``MASTER_ADDR`` and ``MASTER_PORT`` (all required).
            backend: overrides :func:`default_backend` (of
                ``LOCAL_WORLD_SIZE`` ranks, which torchrun sets; else of one).
                ``LOCAL_WORLD_SIZE`` also gives :attr:`local_world_size`.
            timeout_s: see :attr:`timeout_s`.
            stall_notice_s: see :attr:`stall_notice_s`.

        Raises:
            ValueError: a variable is missing or malformed; the message names it.
        """
        missing = [name for name in _REQUIRED if not env.get(name)]
        if missing:
            raise ValueError(
                f"worker context: environment variable(s) {', '.join(missing)} "
                "not set; launch with torchrun or graphwire.comm.launch"
            )
        values = {name: _int_var(env, name) for name in _INTS}
        local_world = None
        if env.get("LOCAL_WORLD_SIZE"):
            local_world = _int_var(env, "LOCAL_WORLD_SIZE")
            if not 0 <= values["LOCAL_RANK"] < local_world:
                raise ValueError(
                    f"worker context: LOCAL_RANK {values['LOCAL_RANK']} is not "
                    f"below LOCAL_WORLD_SIZE {local_world} (the ranks on this "
                    "machine)"
                )
        if backend is None:
            backend = default_backend(local_world or 1)
        try:
            return cls(
                rank=values["RANK"],
                world_size=values["WORLD_SIZE"],
                local_rank=values["LOCAL_RANK"],
                master_addr=env["MASTER_ADDR"],
                master_port=values["MASTER_PORT"],
                backend=backend,
                timeout_s=timeout_s,
                stall_notice_s=stall_notice_s,
                local_world_size=local_world,
            )
        except ValueError as error:
            found = ", ".join(f"{name}={env[name]}" for name in _REQUIRED)
            raise ValueError(f"worker context ({found}): {error}") from None

    @property
    def spans_machines(self) -> bool:
        """Whether the run's workers are on more machines than this one:
        fewer of them here than in the run, or not known."""
        return self.local_world_size != self.world_size

    @property
    def device(self) -> torch.device:
        """Where this worker's communicated tensors live.

        ``cuda:<local_rank>`` under NCCL, else the CPU."""
        if self.backend == "nccl":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    @property
    def init_method(self) -> str:
        """``tcp://<master_addr>:<master_port>`` (IPv6 addresses bracketed)."""
        host = self.master_addr
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"tcp://{host}:{self.master_port}"

    def to_env(self) -> dict[str, str]:
        """The ``torchrun`` variables that describe this worker.

        The inverse of :meth:`from_env`, less the backend and timeouts."""
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return env


def _has_port(host: str) -> bool:
    """Whether ``host`` ends in ``:port`` (``[v6]:port`` or ``name:port``);
    a bare IPv6 address has colons but no port."""
    if host.startswith("["):
        return not host.endswith("]")
    return host.count(":") == 1  # (a name or IPv4 address has none)


def _int_var(env: Mapping[str, str], name: str) -> int:
    text = env[name].strip()
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"worker context: environment variable {name} must be an integer, "
            f"got {env[name]!r}"
        ) from None
