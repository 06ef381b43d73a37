"""WorkerContext: torchrun variables in, validated; device and env round trip."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from graphwire.comm.context import WorkerContext, default_backend

ENV = {
    "RANK": "2",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "0",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def test_from_env_reads_torchrun_variables() -> None:
    ctx = WorkerContext.from_env(ENV, backend="gloo", timeout_s=7)
    assert (ctx.rank, ctx.world_size, ctx.local_rank) == (2, 4, 0)
    assert (ctx.master_addr, ctx.master_port) == ("127.0.0.1", 29500)
    assert (ctx.backend, ctx.timeout_s) == ("gloo", 7)
    assert ctx.device == torch.device("cpu")
    assert ctx.init_method == "tcp://127.0.0.1:29500"
    assert WorkerContext.from_env(ctx.to_env(), backend="gloo", timeout_s=7) == ctx


def test_default_backend_follows_cuda() -> None:
    ctx = WorkerContext.from_env(ENV)
    assert ctx.backend == default_backend()
    assert ctx.backend == ("nccl" if torch.cuda.is_available() else "gloo")


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """This process sees ``count`` CUDA devices (CUDA itself is not touched)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    ("gpus", "local_ranks", "expected"),
    [(0, 1, "gloo"), (1, 1, "nccl"), (1, 4, "gloo"), (4, 4, "nccl"), (8, 4, "nccl")],
)
def test_default_backend_is_nccl_only_with_a_gpu_per_local_rank(
    monkeypatch: pytest.MonkeyPatch, gpus: int, local_ranks: int, expected: str
) -> None:
    """A one-GPU machine ran no workers at all: NCCL was chosen, and it
    needs a GPU per rank."""
    _gpus(monkeypatch, gpus)
    assert default_backend(local_ranks) == expected
    env = ENV | {"LOCAL_WORLD_SIZE": str(local_ranks)}
    assert WorkerContext.from_env(env).backend == expected
    assert WorkerContext.from_env(env, backend="gloo").backend == "gloo"
    assert WorkerContext.from_env(env).local_world_size == local_ranks


@pytest.mark.parametrize(
    ("local_world", "spans"), [("4", False), ("2", True), (None, True)]
)
def test_a_run_spans_machines_when_this_one_holds_fewer_ranks(
    local_world: str | None, spans: bool
) -> None:
    """torchrun --nnodes 2 --nproc-per-node 2: 2 ranks here, 4 in all. A
    launcher that does not say (no LOCAL_WORLD_SIZE) may span machines."""
    env = ENV | ({"LOCAL_WORLD_SIZE": local_world} if local_world else {})
    ctx = WorkerContext.from_env(env, backend="gloo")
    assert ctx.spans_machines is spans
    assert WorkerContext.from_env(ctx.to_env(), backend="gloo") == ctx
    with pytest.raises(ValueError, match="local_world_size: expected 1 <= "):
        dataclasses.replace(ctx, local_world_size=5)


def test_nccl_device_is_the_local_gpu() -> None:
    ctx = WorkerContext(1, 2, 1, "10.0.0.1", 1234, "nccl")
    assert ctx.device == torch.device("cuda", 1)  # no CUDA call needed


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"])
def test_missing_variable_is_named(name: str) -> None:
    env = {k: v for k, v in ENV.items() if k != name}
    with pytest.raises(ValueError, match=name):
        WorkerContext.from_env(env)


def test_malformed_variable_is_named() -> None:
    with pytest.raises(ValueError, match="MASTER_PORT must be an integer, got 'x1'"):
        WorkerContext.from_env(ENV | {"MASTER_PORT": "x1"})
    with pytest.raises(ValueError, match=r"RANK=4.*rank: expected 0 <= rank < 4"):
        WorkerContext.from_env(ENV | {"RANK": "4"})
    # No rank of the machine would lead it (write its checkpoints' index).
    with pytest.raises(
        ValueError, match="LOCAL_RANK 1 is not below LOCAL_WORLD_SIZE 1"
    ):
        WorkerContext.from_env(ENV | {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"})
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE must be an integer"):
        WorkerContext.from_env(ENV | {"LOCAL_WORLD_SIZE": "two"})
    assert WorkerContext.from_env(ENV | {"LOCAL_WORLD_SIZE": "2"}).local_rank == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("world_size", 0, "world_size"),
        ("local_rank", -1, "local_rank"),
        ("local_rank", 2, r"local_rank: expected 0 <= local_rank < 2"),
        ("master_addr", "127.0.0.1:80", "master_addr: expected a host name or .* "),
        ("master_addr", "[::1]:80", "without a port"),
        ("master_port", 70000, "master_port"),
        ("backend", "mpi", "backend"),
        ("timeout_s", 0.0, "timeout_s"),
        ("timeout_s", float("inf"), r"timeout_s: expected > 0 and <= 1e\+09"),
        ("timeout_s", 1e300, "timeout_s"),  # datetime.timedelta overflowed
    ],
)
def test_invalid_fields(field: str, value: object, message: str) -> None:
    ctx = WorkerContext(0, 2, 0, "127.0.0.1", 1234, "gloo")
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(ctx, **{field: value})


def test_context_is_frozen_and_ipv6_is_bracketed() -> None:
    ctx = WorkerContext(0, 1, 0, "::1", 1234, "gloo")
    assert ctx.init_method == "tcp://[::1]:1234"
    assert dataclasses.replace(ctx, master_addr="[::1]").init_method == (
        "tcp://[::1]:1234"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.rank = 1  # type: ignore[misc]
