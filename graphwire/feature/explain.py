"""`Explainer`: DGS's online GNNExplainer on a star-shaped explanation graph.

DGS (seed ``004``, §3.2; digest §1.4-1.8) learns which remote nodes and which
feature dimensions a worker's model relies on, and samples by that. Each
worker keeps an *explanation graph* of its part: one super-node ``v_G`` for
all its local nodes (its features the local nodes' mean: average pooling)
and one node per remote neighbour, each with one edge to ``v_G`` (plus the
self-loops the model kind expects). Every ``T_ex`` batches the explainer
takes a snapshot of the training model and trains two GNNExplainer masks
(Ying et al., 2019) on that graph:

- a node mask ``σ(M_N)`` over the remote nodes, applied to their input rows
  (PyG's ``node_mask_type="object"``: GraphSAGE and GAT ignore edge
  weights, and each remote node has one edge, so masking its row masks the
  edge);
- a feature mask ``σ(M_F)`` over the ``F`` dimensions, applied to every row
  (``"common_attributes"``).

The loss is the cross-entropy of the masked prediction at ``v_G`` against
the unmasked one (a distribution: ``v_G`` pools nodes of mixed labels),
plus PyG's regularisers for node and feature masks: ``size`` times the
masks' mean and ``ent`` times the mean binary entropy of their entries
(PyG's defaults, ``node_feat_size = 1.0``, ``node_feat_ent = 0.1``).
Training stops after ``epochs`` steps of Adam, or as soon as the loss is at
most ``loss_threshold``. A star of more than ``nodes`` remote nodes is
explained a random subset of that many at a time (drawn anew each step,
seeded), each step's target the model's prediction on that subset: a step
then costs ``nodes`` rows, not the whole halo's, which on a large part is as
many rows as several training batches read. Only the subset's node masks
take that step's penalties and gradient. Each round starts from the last one's masks.
The masks are PyG's initial ones in the first round: ``N(0, 0.1²)`` logits
(seeded).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from graphwire.graph.graph import Graph
from graphwire.nn.base import MessageGraph
from graphwire.nn.models import GNN, LayerKind

__all__ = ["Explained", "Explainer", "ExplainSettings", "star_graph", "star_layers"]

EPS = 1e-15  # PyG's, inside the entropy's logs


@dataclass(frozen=True)
class ExplainSettings:
    """GNNExplainer's settings (PyG's defaults where DGS names none).

    Attributes:
        epochs: at most this many mask updates per round (𝒯_E).
        loss_threshold: stop a round once the loss is at most this (ℒ).
        lr: Adam's learning rate.
        size: weight of the masks' mean (``node_feat_size``).
        entropy: weight of their mean entropy (``node_feat_ent``).
        nodes: the most remote nodes one step reads (a seeded random subset
            of the star's, drawn anew each step); None: all.
    """

    epochs: int = 50
    loss_threshold: float = 0.01
    lr: float = 0.01
    size: float = 1.0
    entropy: float = 0.1
    nodes: int | None = 2048


@dataclass(frozen=True)
class Explained:
    """One round's result.

    Attributes:
        node_mask: float32 [m], each remote node's importance in [0, 1].
        feature_mask: float32 [F], each dimension's importance in [0, 1].
        loss: the last step's loss.
        epochs: mask updates taken.
        cpu_s: CPU seconds of the thread that ran the round.
    """

    node_mask: torch.Tensor
    feature_mask: torch.Tensor
    loss: float
    epochs: int
    cpu_s: float


def star_graph(num_remote: int, kind: LayerKind) -> MessageGraph:
    """The explanation graph's structure: node 0 is ``v_G``, nodes ``1..m``
    the remote ones, each with an edge into ``v_G``; as ``kind`` aggregates
    (self-loops, GCN's weights)."""
    n = num_remote + 1
    src = torch.arange(1, n, dtype=torch.int64)
    graph = Graph.from_edge_index(src, torch.zeros_like(src), n)
    graph, weight = kind.prepare(graph)
    return MessageGraph(graph.indptr, graph.indices, n, n, weight)


def star_layers(num_remote: int, kind: LayerKind, layers: int) -> list[MessageGraph]:
    """One star per layer, the last one with ``v_G`` as its only
    destination: only ``v_G``'s prediction is explained, so the last layer
    computes no other row (the same prediction, a layer's work less)."""
    star = star_graph(num_remote, kind)
    stop = int(star.indptr[1])
    weight = None if star.edge_weight is None else star.edge_weight[:stop]
    last = MessageGraph(star.indptr[:2], star.indices[:stop], star.num_src, 1, weight)
    return [star] * (layers - 1) + [last]


class Explainer:
    """One worker's explanation module (the module docstring).

    Args:
        model: the training model; the explainer keeps its own copy, into
            which :meth:`explain` loads each snapshot.
        kind: the model's layer kind (the star's self-loops and weights).
        local_x: float32 [F], the mean feature row of the local nodes.
        remote_x: float32 [m, F], the remote nodes' feature rows.
        settings: the GNNExplainer settings.
        seed: seeds the first round's masks.
    """

    def __init__(
        self,
        model: GNN,
        kind: LayerKind,
        local_x: torch.Tensor,
        remote_x: torch.Tensor,
        settings: ExplainSettings,
        seed: int,
    ) -> None:
        if local_x.dim() != 1 or remote_x.dim() != 2:
            raise ValueError(
                f"Explainer: expected local_x [F] and remote_x [m, F], found "
                f"{tuple(local_x.shape)} and {tuple(remote_x.shape)}"
            )
        if remote_x.shape[1] != local_x.numel():
            raise ValueError(
                f"Explainer: remote_x has {remote_x.shape[1]} columns, local_x "
                f"{local_x.numel()}"
            )
        self.model = copy.deepcopy(model)
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.settings = settings
        self.x = torch.cat([local_x.unsqueeze(0), remote_x]).to(torch.float32)
        layers = self.model.num_layers
        self.graphs = star_layers(remote_x.shape[0], kind, layers)
        cap = settings.nodes
        self.sampled = self.graphs
        if cap is not None and remote_x.shape[0] > cap:
            self.sampled = star_layers(cap, kind, layers)
        self.seed = seed
        gen = torch.Generator().manual_seed(seed)
        self.node_logit = torch.randn(remote_x.shape[0], generator=gen) * 0.1
        self.feature_logit = torch.randn(local_x.numel(), generator=gen) * 0.1
        self.rounds = 0

    @property
    def num_remote(self) -> int:
        return self.x.shape[0] - 1

    def set_remote(self, pos: torch.Tensor, rows: torch.Tensor) -> None:
        """Remote nodes ``pos``'s feature rows are ``rows`` (a star graph
        built before its rows were all at hand)."""
        self.x[1:][pos] = rows

    def state(self) -> dict[str, torch.Tensor | int]:
        """The masks' logits and the rounds run (a checkpoint's part)."""
        return {
            "node_logit": self.node_logit.clone(),
            "feature_logit": self.feature_logit.clone(),
            "rounds": self.rounds,
        }

    def load_state(self, state: dict[str, torch.Tensor | int]) -> None:
        node, feature = state["node_logit"], state["feature_logit"]
        assert isinstance(node, torch.Tensor) and isinstance(feature, torch.Tensor)
        if (
            node.shape != self.node_logit.shape
            or feature.shape != self.feature_logit.shape
        ):
            raise ValueError(
                f"explainer state: masks of {tuple(node.shape)} and "
                f"{tuple(feature.shape)}, expected {tuple(self.node_logit.shape)} "
                f"and {tuple(self.feature_logit.shape)}"
            )
        self.node_logit = node.clone()
        self.feature_logit = feature.clone()
        self.rounds = int(state["rounds"])

    def explain(self, weights: dict[str, torch.Tensor]) -> Explained:
        """One round on the model ``weights`` (a state dict snapshot)."""
        began = time.thread_time()
        self.model.load_state_dict(weights)
        node = self.node_logit.clone().requires_grad_(True)
        feature = self.feature_logit.clone().requires_grad_(True)
        optimizer = torch.optim.Adam([node, feature], lr=self.settings.lr)
        gen = torch.Generator().manual_seed(self.seed + self.rounds)
        loss = torch.tensor(float("inf"))
        steps = 0
        for _ in range(self.settings.epochs):
            rows = self._rows(gen)
            optimizer.zero_grad()
            loss = self._loss(node, feature, rows)
            if float(loss.detach()) <= self.settings.loss_threshold:
                break
            loss.backward()
            optimizer.step()
            steps += 1
        self.node_logit = node.detach()
        self.feature_logit = feature.detach()
        self.rounds += 1
        return Explained(
            node_mask=self.node_logit.sigmoid(),
            feature_mask=self.feature_logit.sigmoid(),
            loss=float(loss.detach()),
            epochs=steps,
            cpu_s=time.thread_time() - began,
        )

    def _rows(self, gen: torch.Generator) -> torch.Tensor | None:
        """The remote nodes of one step (indices into the mask), or None:
        all of them."""
        cap = self.settings.nodes
        if cap is None or self.num_remote <= cap:
            return None
        return torch.randperm(self.num_remote, generator=gen)[:cap]

    def _predict(self, x: torch.Tensor) -> torch.Tensor:
        """The model's logits at ``v_G`` (``x``: its row, then the star's)."""
        graphs = self.graphs if x.shape[0] == self.x.shape[0] else self.sampled
        return self.model(graphs, x)[0]

    def _loss(
        self, node: torch.Tensor, feature: torch.Tensor, rows: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.x if rows is None else torch.cat([self.x[:1], self.x[1:][rows]])
        with torch.no_grad():
            target = F.softmax(self._predict(x), dim=-1)
        node_mask, feature_mask = node.sigmoid(), feature.sigmoid()
        if rows is not None:
            node_mask = node_mask[rows]
        row_mask = torch.cat([node_mask.new_ones(1), node_mask]).unsqueeze(1)
        logits = self._predict(x * row_mask * feature_mask.unsqueeze(0))
        loss = -(target * F.log_softmax(logits, dim=-1)).sum()
        for mask in (node_mask, feature_mask):
            if mask.numel():
                loss = loss + self.settings.size * mask.mean()
                loss = loss + self.settings.entropy * _entropy(mask).mean()
        return loss


def _entropy(mask: torch.Tensor) -> torch.Tensor:
    return -mask * torch.log(mask + EPS) - (1 - mask) * torch.log(1 - mask + EPS)
