"""Partitioning: who owns which node, what it costs, and the partitioned format.

Importing the package registers every built-in partitioner in ``PARTITIONERS``
(``random``, ``chunk``, ``metis``, ``locality``, ``blocks``), so
``get_partitioner(name)`` finds them.
"""

from graphwire.partition.base import (
    PARTITIONERS,
    Partition,
    Partitioner,
    get_partitioner,
)
from graphwire.partition.blocks import BlocksPartitioner
from graphwire.partition.book import PartitionBook
from graphwire.partition.chunk import ChunkPartitioner
from graphwire.partition.format import (
    load_part,
    load_partition_meta,
    write_partitioned,
)
from graphwire.partition.local import LocalPart
from graphwire.partition.locality import LocalityPartitioner
from graphwire.partition.metis import MetisPartitioner
from graphwire.partition.random import RandomPartitioner
from graphwire.partition.stats import PartitionStats

__all__ = [
    "PARTITIONERS",
    "BlocksPartitioner",
    "ChunkPartitioner",
    "LocalPart",
    "LocalityPartitioner",
    "MetisPartitioner",
    "Partition",
    "PartitionBook",
    "PartitionStats",
    "Partitioner",
    "RandomPartitioner",
    "get_partitioner",
    "load_part",
    "load_partition_meta",
    "write_partitioned",
]
