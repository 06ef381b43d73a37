"""BackwardSync: each layer's gradient sum starts during the backward, and the
sums are bitwise those of one flat all-reduce after it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from graphwire.comm.local import LocalTransport, run_local
from graphwire.nn.models import GNN
from graphwire.run.collective import sync_gradients
from graphwire.run.gradsync import BackwardSync, layer_buckets


def _model() -> GNN:
    torch.manual_seed(0)
    model = GNN([nn.Linear(6, 5), nn.Linear(5, 3)], torch.relu, 0.0, 0.0)
    model.scale = nn.Parameter(torch.ones(3))  # of no layer: the last bucket
    model.unused = nn.Parameter(torch.ones(2))  # never gets a gradient
    return model


def _loss(model: GNN, rank: int) -> torch.Tensor:
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(rank + 1))
    h = torch.relu(model.layers[0](x))
    return (model.layers[1](h) * model.scale).square().sum()


def test_layer_buckets_go_last_layer_first_then_the_rest() -> None:
    model = _model()
    buckets = layer_buckets(model)
    assert [len(b) for b in buckets] == [2, 2, 2]
    assert buckets[0][0] is model.layers[1].weight
    assert buckets[1][0] is model.layers[0].weight
    assert {id(p) for p in buckets[2]} == {id(model.scale), id(model.unused)}


def test_sums_start_during_the_backward_and_equal_one_flat_all_reduce() -> None:
    def rank(transport: LocalTransport) -> tuple[list[torch.Tensor], ...]:
        model = _model()
        flat = copy.deepcopy(model)
        sync = BackwardSync.for_model(model, transport)
        handed: list[int] = []
        # Registered after the sync's own hooks: each sees what was handed
        # over once one of the input layer's gradients is complete.
        for p in model.layers[0].parameters():
            p.register_post_accumulate_grad_hook(lambda _: handed.append(sync._next))
        for _ in range(2):  # twice: the hooks re-arm
            model.zero_grad(set_to_none=True)
            sync.arm()
            _loss(model, transport.rank).backward()
            sync.finish()
        sync.close()
        flat.zero_grad(set_to_none=True)
        _loss(flat, transport.rank).backward()
        sync_gradients(flat, transport)
        got = [p.grad for p in model.parameters()]
        want = [p.grad for p in flat.parameters()]
        return got, want, handed

    for got, want, handed in run_local(rank, 3):
        # the last layer's bucket left before the input layer's completed,
        # the input layer's as soon as it did
        assert handed == [1, 2, 1, 2]
        for g, w in zip(got, want, strict=True):
            assert g is not None and torch.equal(g, w)


def test_a_failed_sum_is_raised_by_finish_and_a_finish_needs_an_arm() -> None:
    class Failing(LocalTransport):
        def all_reduce_sum(self, tensor: torch.Tensor, tag: str) -> torch.Tensor:
            raise RuntimeError(f"{tag}: peer 1 is gone")

    def rank(transport: LocalTransport) -> str:
        transport.__class__ = Failing
        model = _model()
        sync = BackwardSync.for_model(model, transport)
        with pytest.raises(RuntimeError, match="arm"):
            sync.finish()
        sync.arm()
        _loss(model, transport.rank).backward()
        with pytest.raises(RuntimeError, match="sync.grad: peer 1 is gone"):
            sync.finish()
        sync.close()
        return "ok"

    assert run_local(rank, 2) == ["ok", "ok"]
