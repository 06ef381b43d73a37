"""Neighbour samplers that turn seed nodes into per-layer `Block`s."""

from graphwire.sampler.base import Block, SampledBatch, derive_seed
from graphwire.sampler.uniform import UniformNeighborSampler

__all__ = ["Block", "SampledBatch", "UniformNeighborSampler", "derive_seed"]
