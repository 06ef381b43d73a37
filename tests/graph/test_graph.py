"""The Graph core: construction, validation and structural helpers."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch_geometric.data import Data

from graphwire.graph.graph import Graph, GraphError


@st.composite
def edge_lists(draw):
    n = draw(st.integers(1, 30))
    m = draw(st.integers(0, 80))
    src = draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=m, max_size=m))
    return n, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


def _edge_multiset(graph: Graph) -> list[tuple[int, int]]:
    src, dst = graph.edge_index()
    return sorted(zip(src.tolist(), dst.tolist(), strict=True))


@given(edge_lists())
def test_csr_holds_exactly_the_input_edges(case) -> None:
    n, src, dst = case
    graph = Graph.from_edge_index(src, dst, num_nodes=n)
    assert graph.num_nodes == n and graph.num_edges == src.size
    assert _edge_multiset(graph) == sorted(zip(src.tolist(), dst.tolist(), strict=True))
    assert torch.equal(
        graph.in_degrees(), torch.bincount(torch.from_numpy(dst), minlength=n)
    )
    assert torch.equal(
        graph.out_degrees(), torch.bincount(torch.from_numpy(src), minlength=n)
    )


@given(edge_lists())
def test_structural_helpers(case) -> None:
    n, src, dst = case
    graph = Graph.from_edge_index(src, dst, num_nodes=n)
    pairs = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert _edge_multiset(graph.deduplicate()) == sorted(pairs)
    sym = {(a, b) for a, b in pairs} | {(b, a) for a, b in pairs}
    assert _edge_multiset(graph.symmetric) == sorted(sym)
    no_loops = [(a, b) for a, b in _edge_multiset(graph) if a != b]
    assert _edge_multiset(graph.remove_self_loops()) == no_loops
    looped = graph.add_self_loops()
    assert _edge_multiset(looped) == sorted(no_loops + [(v, v) for v in range(n)])
    assert _edge_multiset(graph.reverse) == sorted(
        (b, a) for a, b in _edge_multiset(graph)
    )


def test_gcn_norm_matches_dense_formula() -> None:
    graph = Graph.from_edge_index([0, 1, 1, 2, 3], [1, 0, 2, 1, 1]).add_self_loops()
    dense = torch.zeros(4, 4)
    src, dst = graph.edge_index()
    dense[dst, src] = 1.0
    d_in = dense.sum(1).rsqrt()
    d_out = dense.sum(0).rsqrt()
    expected = (d_in[:, None] * dense * d_out[None, :])[dst, src]
    torch.testing.assert_close(graph.gcn_norm, expected)


def test_from_scipy_and_back() -> None:
    adjacency = sp.random(20, 20, density=0.2, random_state=0, format="coo")
    graph = Graph.from_scipy(adjacency)
    assert (graph.to_scipy() != (adjacency.T != 0).astype(np.float32)).nnz == 0


def test_from_scipy_skips_stored_zeros_and_leaves_the_matrix_alone() -> None:
    """A stored 0 is no edge (``A[src, dst] != 0``); the caller's matrix keeps
    its entries and their order."""
    # Column-major storage of 1 -> 0 (stored 0), 2 -> 0 and 0 -> 1, rows unsorted.
    matrix = sp.csc_matrix(
        (np.array([1.0, 0.0, 1.0]), np.array([2, 1, 0]), np.array([0, 2, 3, 3])),
        shape=(3, 3),
    )
    matrix.has_sorted_indices = False
    before = (matrix.data.copy(), matrix.indices.copy())
    graph = Graph.from_scipy(matrix)
    assert _edge_multiset(graph) == [(0, 1), (2, 0)]
    assert np.array_equal(matrix.data, before[0])
    assert np.array_equal(matrix.indices, before[1])


def _pyg_data(**fields) -> Data:
    """A PyG ``Data`` (PyG is a test dependency, not graphwire's): a 3-ring."""
    fields.setdefault("edge_index", torch.tensor([[0, 1, 2], [1, 2, 0]]))
    fields.setdefault("num_nodes", 3)
    return Data(**fields)


class _DglGraph:
    """A stand-in for a homogeneous ``dgl.DGLGraph``."""

    def __init__(self, src, dst, num_nodes: int, **ndata) -> None:
        self._edges, self._num_nodes, self.ndata = (src, dst), num_nodes, ndata

    def edges(self):
        return self._edges

    def num_nodes(self) -> int:
        return self._num_nodes


def test_from_pyg_and_from_dgl_read_masks_as_splits() -> None:
    mask = torch.tensor([True, False, True])
    graph = Graph.from_pyg(_pyg_data(y=torch.tensor([[0], [1], [0]]), val_mask=mask))
    assert graph.val_idx.tolist() == [0, 2] and graph.y.tolist() == [0, 1, 0]
    ring = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    graph = Graph.from_dgl(_DglGraph(*ring, 3, train_mask=mask))
    assert graph.train_idx.tolist() == [0, 2] and graph.num_edges == 3


@pytest.mark.parametrize(
    "mask, message",
    [
        # geom-gcn style: 10 alternative splits side by side
        (torch.zeros(3, 10, dtype=torch.bool), r"shape \(3, 10\); .* mask\[:, 0\]"),
        (torch.tensor([0, 2]), "found torch.int64 of shape"),  # indices, no mask
        (torch.tensor([True, False]), r"\[num_nodes=3\], found torch.bool of"),
    ],
)
def test_from_pyg_and_from_dgl_name_a_mask_that_is_not_one(mask, message) -> None:
    with pytest.raises(GraphError, match=f"pyg data: test_mask: .*{message}"):
        Graph.from_pyg(_pyg_data(test_mask=mask))
    ring = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    with pytest.raises(GraphError, match=f"dgl ndata: test_mask: .*{message}"):
        Graph.from_dgl(_DglGraph(*ring, 3, test_mask=mask))


@pytest.mark.parametrize(
    "edge_index, found",
    [
        (torch.tensor([[0, 1], [1, 2], [2, 0]]), r"shape \(3, 2\)"),  # [E, 2]
        (None, "None"),
    ],
)
def test_from_pyg_refuses_an_edge_index_that_is_not_2_by_e(edge_index, found) -> None:
    with pytest.raises(GraphError, match=f"edge_index, a tensor of shape .* {found}"):
        Graph.from_pyg(_pyg_data(edge_index=edge_index))


@pytest.mark.parametrize(
    "nodes", [torch.tensor([3, 1]), [3, 1], np.array([3, 1], dtype=np.int32)]
)
def test_subgraph_in_edges(nodes) -> None:
    graph = Graph.from_edge_index([0, 2, 3, 1, 0], [1, 1, 2, 3, 3])
    indptr, sources = graph.subgraph_in_edges(nodes)
    assert indptr.tolist() == [0, 2, 4]
    assert sources.tolist() == [1, 0, 0, 2]


@pytest.mark.parametrize(
    "nodes, message",
    [
        # each failed inside torch (an IndexError, or a mask read as IDs)
        ([3, 4], r"nodes: node IDs must lie in \[0, 4\), found range \[3, 4\]"),
        ([-1], r"nodes: node IDs must lie in \[0, 4\)"),
        (torch.tensor([True, False, True, True]), "nodes: expected an integer dtype"),
        (torch.tensor([[3, 1]]), r"nodes: expected a 1-D index array, found \(1, 2\)"),
    ],
)
def test_subgraph_in_edges_names_bad_node_ids(nodes, message) -> None:
    graph = Graph.from_edge_index([0, 2, 3, 1, 0], [1, 1, 2, 3, 3])
    with pytest.raises(GraphError, match=message):
        graph.subgraph_in_edges(nodes)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(indptr=[0, 2, 1], indices=[0]), "indptr"),
        (dict(indptr=[1, 2], indices=[0]), "indptr"),
        (dict(indptr=[0, 1], indices=[5]), r"indices: node IDs must lie in \[0, 1\)"),
        (dict(indptr=[0, 1], indices=[0.5]), "indices: expected an integer dtype"),
        (dict(indptr=[0, 0, 0], indices=[], x=np.zeros((3, 2))), r"x: expected shape"),
        (dict(indptr=[0, 0, 0], indices=[], y=[0]), r"y: expected shape"),
        (dict(indptr=[0, 0, 0], indices=[], train_idx=[2]), "train_idx"),
        (
            dict(indptr=[0, 0, 0], indices=[], x=np.zeros((2, 2, 1))),
            "x: expected shape",
        ),
        (
            dict(indptr=[0, 0, 0, 0], indices=[], val_idx=[2, 0, 2, 2]),
            r"val_idx: node 2 is listed more than once \(2 repeated entries\)",
        ),
        (
            dict(indptr=[0, 0, 0], indices=[], y=[1, -1], test_idx=[0, 1]),
            r"test_idx: node 1 has label -1 \(unlabelled\)",
        ),
    ],
)
def test_validation_names_the_problem(kwargs, message) -> None:
    with pytest.raises(GraphError, match=message):
        Graph(**kwargs)


def test_edge_index_validation() -> None:
    with pytest.raises(GraphError, match="equal length"):
        Graph.from_edge_index([0, 1], [1])
    with pytest.raises(GraphError, match="must lie in"):
        Graph.from_edge_index([0, -1], [1, 1], num_nodes=2)
    with pytest.raises(GraphError, match="integers"):
        Graph.from_edge_index([0.5], [1.0])


@pytest.mark.parametrize(
    "num_nodes, message",
    [(-1, "num_nodes: must be >= 0, found -1"), (4.0, "num_nodes: expected an int")],
)
def test_from_edge_index_names_a_bad_num_nodes(num_nodes, message) -> None:
    with pytest.raises(GraphError, match=message):
        Graph.from_edge_index([0], [1], num_nodes=num_nodes)


def test_from_edge_index_takes_numpy_and_torch_counts() -> None:
    assert Graph.from_edge_index([0], [1], num_nodes=np.int64(4)).num_nodes == 4
    assert Graph.from_edge_index([0], [1], num_nodes=torch.tensor(4)).num_nodes == 4


def test_node_data_longer_than_the_inferred_node_count_says_pass_num_nodes() -> None:
    """Nodes 2 and 3 have no edges: without num_nodes they cannot be known."""
    with pytest.raises(GraphError, match=r"x: has 4 rows, .* pass num_nodes=4"):
        Graph.from_edge_index([0], [1], x=torch.zeros(4, 2))
    assert Graph.from_edge_index([0], [1], 4, x=torch.zeros(4, 2)).num_nodes == 4


@pytest.mark.parametrize("value", [None, ["a", "b"]])
def test_a_non_numeric_array_is_named(value) -> None:
    with pytest.raises(GraphError, match="indices: expected a numeric array"):
        Graph(indptr=[0, 1, 2], indices=value)


@pytest.mark.parametrize("wrap", [np.asarray, torch.as_tensor], ids=["numpy", "torch"])
@pytest.mark.parametrize("values", [[[0, 2], [1, 0]], [[True, False], [False, True]]])
def test_integer_and_boolean_features_become_float32(wrap, values) -> None:
    graph = Graph(indptr=[0, 0, 0], indices=[], x=wrap(values))
    assert graph.x is not None and graph.x.dtype == torch.float32
    assert graph.x.tolist() == [[float(v) for v in row] for row in values]


def test_features_that_require_grad_are_detached() -> None:
    """Training must not write ``.grad`` into the caller's tensor."""
    x = torch.ones(2, 3, requires_grad=True)
    graph = Graph(indptr=[0, 0, 0], indices=[], x=x)
    assert graph.x is not None and not graph.x.requires_grad
    assert graph.x.data_ptr() == x.data_ptr()  # the same memory, no copy


def test_a_boolean_mask_as_a_split_says_pass_its_indices() -> None:
    mask = torch.tensor([True, False, True])
    with pytest.raises(GraphError, match=r"train_idx: .*torch.bool; a boolean mask"):
        Graph(indptr=[0, 0, 0, 0], indices=[], train_idx=mask)
    with pytest.raises(GraphError, match="x: expected real numbers"):
        Graph(indptr=[0, 0], indices=[], x=np.ones((1, 2), np.complex64))


def test_uint64_ids_beyond_int64_are_named_not_wrapped() -> None:
    src = np.array([0, 2**63 + 5], dtype=np.uint64)
    with pytest.raises(GraphError, match=f"src holds node ID {2**63 + 5}, beyond"):
        Graph.from_edge_index(src, np.array([1, 0], dtype=np.uint64))
    small = Graph.from_edge_index(
        np.array([0, 1], np.uint64), np.array([1, 0], np.uint64)
    )
    assert small.num_edges == 2 and small.indices.dtype == torch.int64


@pytest.mark.parametrize(
    "field, value",
    [
        ("y", np.array([0, 2**64 - 1, 1], np.uint64)),  # would wrap to -1
        ("y", np.array([0, 2**63 + 5, 1], np.uint64)),
        ("y", torch.tensor([0, 2**63 + 5, 1], dtype=torch.uint64)),
        ("train_idx", np.array([2**64 - 1], np.uint64)),
    ],
)
def test_uint64_node_data_beyond_int64_is_named_not_wrapped(field, value) -> None:
    peak = int(np.asarray(value).max())
    with pytest.raises(GraphError, match=f"{field}: holds value {peak}, beyond int64"):
        Graph.from_edge_index([0, 1], [1, 2], **{field: value})
    in_range = np.array([0, 2, 1], np.uint64)
    assert Graph.from_edge_index([0, 1], [1, 2], y=in_range).y.tolist() == [0, 2, 1]


def _ring_dgl(**ndata) -> _DglGraph:
    return _DglGraph(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0]), 3, **ndata)


@pytest.mark.parametrize(
    "labels",
    [np.array([0, 2, 1]), np.array([[0], [2], [1]]), torch.tensor([[0], [2], [1]])],
)
def test_from_pyg_and_from_dgl_read_labels_n_or_n_by_1(labels) -> None:
    # A NumPy y used to fail in y.view(-1); DGL refused [N, 1] that PyG flattened.
    assert Graph.from_pyg(_pyg_data(y=labels)).y.tolist() == [0, 2, 1]
    assert Graph.from_dgl(_ring_dgl(label=labels)).y.tolist() == [0, 2, 1]


def test_from_pyg_and_from_dgl_refuse_labels_of_other_shapes() -> None:
    multi = torch.zeros(3, 2, dtype=torch.int64)  # used to be flattened to [6]
    expected = r"y: expected class labels of shape \[N\] or \[N, 1\], found \(3, 2\)"
    with pytest.raises(GraphError, match=f"pyg data: {expected}"):
        Graph.from_pyg(_pyg_data(y=multi))
    with pytest.raises(GraphError, match=r"dgl ndata: label: .* found \(3, 2\)"):
        Graph.from_dgl(_ring_dgl(label=multi))


def test_from_pyg_and_from_dgl_refuse_a_fractional_node_count() -> None:
    with pytest.raises(
        GraphError, match="pyg data: num_nodes: expected an int, found 3.7"
    ):
        Graph.from_pyg(_pyg_data(num_nodes=3.7))
    dgl = _ring_dgl()
    dgl._num_nodes = 3.7
    with pytest.raises(GraphError, match=r"num_nodes\(\): expected an int, found 3.7"):
        Graph.from_dgl(dgl)
    assert Graph.from_pyg(_pyg_data(num_nodes=np.int64(4))).num_nodes == 4


def test_from_pyg_counts_nodes_as_pyg_does() -> None:
    """Without num_nodes, a Data has as many nodes as x has rows (the last
    ones may have no edges), and PyG's guess from edge_index is not asked
    for (it warns)."""

    class MyData(Data):  # a user's subclass is read as PyG's own
        pass

    data = _pyg_data(x=torch.ones(5, 2))
    del data.num_nodes
    assert data.num_nodes == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Graph.from_pyg(MyData(edge_index=data.edge_index)).num_nodes == 3
        graph = Graph.from_pyg(data)
        assert graph.num_nodes == 5 and graph.in_degrees().tolist() == [1, 1, 1, 0, 0]
        assert (
            Graph.from_pyg(_pyg_data(edge_index=torch.tensor([[0], [1]]))).num_nodes
            == 3
        )


def test_from_pyg_reads_another_objects_num_nodes_as_an_attribute() -> None:
    """Only a PyG object's ``num_nodes`` is looked up as stored (``in``): on
    one that indexes by name but defines no ``__contains__``, ``in`` would
    iterate it with ``obj[0]``."""

    class Record:
        def __init__(self, **fields: object) -> None:
            self.__dict__.update(fields)

        def __getitem__(self, name: str) -> object:
            return self.__dict__[name]

    ring = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert Graph.from_pyg(Record(edge_index=ring, num_nodes=5)).num_nodes == 5


def test_from_pyg_checks_masks_against_the_inferred_node_count() -> None:
    data = _pyg_data(train_mask=torch.tensor([True, False]))
    del data.num_nodes  # inferred from edge_index: 3 nodes
    with pytest.raises(
        GraphError, match=r"train_mask: .*\[num_nodes=3\], found .*\(2,\)"
    ):
        Graph.from_pyg(data)
    data.train_mask = torch.ones(4, dtype=torch.bool)
    with pytest.raises(GraphError, match="train_mask: has 4 rows, .* pass num_nodes=4"):
        Graph.from_pyg(data)
    data.train_mask = torch.tensor([True, False, True])
    assert Graph.from_pyg(data).train_idx.tolist() == [0, 2]


def test_float64_features_beyond_float32_are_refused_not_made_inf() -> None:
    x = np.ones((3, 2))
    x[1, 1] = 1e300
    with pytest.raises(GraphError, match=r"x: value 1e\+300 at \[1, 1\] does not fit"):
        Graph.from_edge_index([0, 1, 2], [1, 2, 0], x=x)
    with pytest.raises(GraphError, match="does not fit in torch.float32"):
        Graph.from_edge_index([0, 1, 2], [1, 2, 0], x=torch.from_numpy(x))
    x[1, 1] = np.inf  # already infinite: not an overflow (loaders refuse it)
    x[2, 0] = 1e-300  # underflow to 0 is a rounding, kept
    graph = Graph.from_edge_index([0, 1, 2], [1, 2, 0], x=x)
    assert graph.x[1, 1] == float("inf") and graph.x[2, 0] == 0


def test_from_scipy_names_a_1d_sparse_array() -> None:
    sp = pytest.importorskip("scipy.sparse")
    vector = sp.coo_array(np.array([1, 0, 1]))
    with pytest.raises(GraphError, match=r"expected a square .* shape \(3,\)"):
        Graph.from_scipy(vector)


@pytest.mark.parametrize(
    "splits, message",
    [
        (dict(train_idx=[0, 1], test_idx=[3, 1]), "test_idx: node 1 is also in train"),
        (dict(val_idx=[2], test_idx=[2, 0]), "test_idx: node 2 is also in val_idx"),
        (
            dict(train_idx=[0, 3], val_idx=[1, 3], test_idx=[0, 2]),
            r"node 0 is also in train_idx \(2 nodes in two splits\)",
        ),
    ],
)
def test_a_node_in_two_splits_is_named(splits, message) -> None:
    with pytest.raises(GraphError, match=message):
        Graph(indptr=[0, 0, 0, 0, 0], indices=[], **splits)
    disjoint = Graph(indptr=[0, 0, 0, 0, 0], indices=[], train_idx=[0], test_idx=[1])
    with pytest.raises(GraphError, match="test_idx: node 1 is also in val_idx"):
        disjoint.replace(val_idx=[1, 2])  # replace() checks again


@pytest.mark.parametrize("as_tensor", [False, True])
def test_from_edge_index_owns_its_indices(as_tensor: bool) -> None:
    src, dst = np.array([2, 0, 1]), np.array([0, 1, 2])  # dst sorted: no reorder
    graph = Graph.from_edge_index(
        torch.from_numpy(src) if as_tensor else src,
        torch.from_numpy(dst) if as_tensor else dst,
    )
    src[:] = 0
    dst[:] = 0
    assert graph.indices.tolist() == [2, 0, 1]
    assert graph.indptr.tolist() == [0, 1, 2, 3]


@given(edge_lists(), st.randoms(use_true_random=False))
def test_permute_renumbers_edges_and_node_data(case, rnd) -> None:
    n, src, dst = case
    order = list(range(n))
    rnd.shuffle(order)
    split = sorted(rnd.sample(range(n), n // 2))
    graph = Graph.from_edge_index(
        src,
        dst,
        num_nodes=n,
        x=torch.arange(n, dtype=torch.float32)[:, None],
        y=torch.arange(n),
        train_idx=split,
    )
    permuted = graph.permute(order)
    new_of_old = {old: new for new, old in enumerate(order)}
    assert _edge_multiset(permuted) == sorted(
        (new_of_old[a], new_of_old[b]) for a, b in _edge_multiset(graph)
    )
    assert permuted.y is not None and permuted.y.tolist() == order
    assert permuted.x is not None and permuted.x[:, 0].tolist() == order
    assert permuted.train_idx is not None
    assert permuted.train_idx.tolist() == sorted(new_of_old[v] for v in split)
    # Each node's in-edges keep their order.
    for new, old in enumerate(order):
        lo, hi = int(graph.indptr[old]), int(graph.indptr[old + 1])
        sources = [new_of_old[v] for v in graph.indices[lo:hi].tolist()]
        plo, phi = int(permuted.indptr[new]), int(permuted.indptr[new + 1])
        assert permuted.indices[plo:phi].tolist() == sources


@pytest.mark.parametrize("order", [[0, 1, 1], [0, 1], [0, 1, 3]])
def test_permute_names_an_order_that_is_not_a_permutation(order) -> None:
    graph = Graph.from_edge_index([0, 1], [1, 2], num_nodes=3)
    with pytest.raises(GraphError, match="order"):
        graph.permute(order)
