"""Tensors as bytes on the wire: rows of any dtype, and messages of tensors.

``TorchTransport.all_to_all`` sends blocks of rows ``[rows, *S]`` of any dtype
as ``uint8 [rows, width]`` (:func:`rows_as_bytes`, :func:`rows_from_bytes`),
so one byte exchange carries every dtype on every backend.

A request or a response of the :mod:`~graphwire.comm.service` is a list of
tensors (node IDs, feature rows, per-node counts). On the wire it is one
``uint8`` tensor (:func:`pack`, :func:`unpack`): an int64 preamble, then each
tensor's bytes in order::

    int64 [1 + 6 * k]   k, then per tensor: dtype code, ndim, up to 4 sizes
    uint8 [*]           tensor 0's bytes, tensor 1's bytes, ...

The preamble is ``8 * (1 + 6 k)`` bytes; it crosses the wire and is counted in
the ledger like the payload. Only the dtypes in ``_DTYPES`` travel (no
pickling), so a message from a peer can never run code here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["bytes_per_row", "pack", "rows_as_bytes", "rows_from_bytes", "unpack"]

_DTYPES = [torch.int64, torch.float32, torch.int32, torch.uint8, torch.bool]
_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
_MAX_DIMS = 4
_FIELDS = 2 + _MAX_DIMS


def bytes_per_row(row_shape: torch.Size, dtype: torch.dtype) -> int:
    """Bytes of one row of shape ``row_shape`` and ``dtype``."""
    return row_shape.numel() * torch.empty((), dtype=dtype).element_size()


def rows_as_bytes(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``[rows, *S]`` as ``uint8 [rows, width]`` (a view when contiguous).

    ``width`` is :func:`bytes_per_row` of its rows."""
    rows = tensor.shape[0]
    if width == 0:
        return torch.empty((rows, 0), dtype=torch.uint8, device=tensor.device)
    flat = tensor.detach().contiguous().reshape(rows, tensor.shape[1:].numel())
    return flat.view(torch.uint8)


def rows_from_bytes(
    block: torch.Tensor, row_shape: torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """Inverse of :func:`rows_as_bytes`: ``uint8 [rows, width]`` as ``[rows, *S]``."""
    rows = block.shape[0]
    if block.shape[1] == 0:
        return torch.empty((rows, *row_shape), dtype=dtype, device=block.device)
    return block.view(dtype).reshape(rows, *row_shape)


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``tensors`` (CPU, at most 4-D, dtypes in ``_DTYPES``) as ``uint8 [*]``."""
    preamble = torch.zeros(1 + _FIELDS * len(tensors), dtype=torch.int64)
    preamble[0] = len(tensors)
    chunks = [preamble.view(torch.uint8)]
    for i, tensor in enumerate(tensors):
        if tensor.dtype not in _CODE or tensor.dim() > _MAX_DIMS:
            raise ValueError(
                f"pack: tensor {i} is {tensor.dtype} with {tensor.dim()} dims; "
                f"expected one of {_DTYPES} with at most {_MAX_DIMS} dims"
            )
        base = 1 + _FIELDS * i
        preamble[base] = _CODE[tensor.dtype]
        preamble[base + 1] = tensor.dim()
        preamble[base + 2 : base + 2 + tensor.dim()] = torch.tensor(tensor.shape)
        flat = tensor.detach().contiguous().reshape(-1)
        chunks.append(flat.view(torch.uint8) if flat.numel() else flat.new_empty(0))
    return torch.cat([c.view(torch.uint8) for c in chunks])


def unpack(message: torch.Tensor) -> list[torch.Tensor]:
    """The tensors :func:`pack` put into ``message`` (copies, writable).

    Raises:
        ValueError: the message is truncated or names an unknown dtype.
    """
    data = message.contiguous().view(torch.uint8)
    if data.numel() < 8:
        raise ValueError(f"unpack: message of {data.numel()} bytes has no preamble")
    # Every view as a wider dtype is of a copy: a message may start at any
    # byte of its storage (a slice of a larger buffer), and a view needs the
    # offset to be a multiple of the dtype's size.
    count = int(data[:8].clone().view(torch.int64)[0])
    head = 8 * (1 + _FIELDS * count)
    if count < 0 or data.numel() < head:
        raise ValueError(f"unpack: truncated preamble ({data.numel()} bytes)")
    preamble = data[:head].clone().view(torch.int64)
    out: list[torch.Tensor] = []
    offset = head
    for i in range(count):
        code, ndim = int(preamble[1 + _FIELDS * i]), int(preamble[2 + _FIELDS * i])
        if not 0 <= code < len(_DTYPES) or not 0 <= ndim <= _MAX_DIMS:
            raise ValueError(f"unpack: tensor {i} has dtype code {code}, ndim {ndim}")
        start = 3 + _FIELDS * i
        shape = [int(s) for s in preamble[start : start + ndim]]
        dtype = _DTYPES[code]
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if offset + size > data.numel():
            raise ValueError(
                f"unpack: tensor {i} needs {size} bytes, {data.numel() - offset} left"
            )
        if size:
            out.append(data[offset : offset + size].clone().view(dtype).reshape(shape))
        else:
            out.append(torch.empty(shape, dtype=dtype))
        offset += size
    if offset != data.numel():
        raise ValueError(f"unpack: {data.numel() - offset} bytes left over")
    return out
