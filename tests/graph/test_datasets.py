"""Dataset specs resolve to the right loader with typed options."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graphwire.graph import synthetic
from graphwire.graph.datasets import load_dataset, parse_spec, spec_paths
from graphwire.graph.graph import Graph
from graphwire.graph.native import save_graph
from graphwire.graph.synthetic import RmatConfig, rmat_graph


def test_parse_spec() -> None:
    assert parse_spec("synthetic:rmat?scale=5&edge_factor=2") == (
        "synthetic",
        "rmat",
        {"scale": "5", "edge_factor": "2"},
    )
    assert parse_spec("planetoid:/data/cora") == ("planetoid", "/data/cora", {})
    assert parse_spec("/some/folder") == ("folder", "/some/folder", {})
    with pytest.raises(ValueError, match="option 'nodes' is given twice"):
        parse_spec("synthetic:products?nodes=10&seed=1&nodes=20")


def test_spec_paths_name_what_a_spec_reads(tmp_path) -> None:
    assert spec_paths("synthetic:rmat?scale=5") == []
    for name in ("ind.cora.x", "ind.cora.graph", "ind.citeseer.x", "cora-gw"):
        (tmp_path / name).write_text("")
    assert spec_paths(f"planetoid:{tmp_path}/cora") == [
        tmp_path / "ind.cora.graph",
        tmp_path / "ind.cora.x",
    ]
    assert spec_paths("npz:/data/g.npz") == [Path("/data/g.npz")]
    assert spec_paths("/data/g") == [Path("/data/g")]


def test_synthetic_spec_options_are_typed() -> None:
    graph = load_dataset("synthetic:products?nodes=2e3&degree=6&features=8&classes=3")
    assert graph.num_nodes == 2000 and graph.num_features == 8
    assert graph.num_classes == 3


@pytest.mark.parametrize(
    "spec, message",
    [
        ("synthetic:products?nodes=1.5", "nodes='1.5' is not an integer"),
        ("synthetic:products?colour=red", "unknown option"),
        ("synthetic:cube", "unknown generator"),
        (
            "synthetic:products?nodes=100&classes=1",
            "dataset synthetic:products: classes: need at least 2, got 1",
        ),
        ("synthetic:rmat?classes=1", "dataset synthetic:rmat: classes: must be 0"),
        ("/no/such/folder", "not a graphwire graph folder"),
    ],
)
def test_bad_specs_are_named(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_dataset(spec)


def test_a_path_that_is_not_a_graph_folder_names_the_spec_it_meant(tmp_path) -> None:
    # A user's first try is often the Planetoid files' folder, one of them, or
    # PATH/NAME without the scheme; the error names the spec that loads it.
    for name in ("ind.cora.graph", "ind.cora.x", "ind.citeseer.graph"):
        (tmp_path / name).write_text("")
    (tmp_path / "g.npz").write_bytes(b"")
    cora, citeseer = f"planetoid:{tmp_path}/cora", f"planetoid:{tmp_path}/citeseer"
    cases = {
        str(tmp_path / "cora"): f"(no such folder); did you mean '{cora}'?",
        str(tmp_path / "ind.cora.x"): f"(a file); did you mean '{cora}'?",
        str(tmp_path): (
            f"(a folder of Planetoid files); did you mean '{citeseer}' or '{cora}'?"
        ),
        str(tmp_path / "g.npz"): f"(a file); did you mean 'npz:{tmp_path}/g.npz'?",
        str(tmp_path / "pubmed"): "not a graphwire graph folder (no such folder)",
    }
    for spec, ending in cases.items():
        with pytest.raises(ValueError) as caught:
            load_dataset(spec)
        assert str(caught.value).endswith(ending), (spec, str(caught.value))


@pytest.mark.parametrize(
    "spec, message",
    [
        # NaN passes comparison-based range checks: these made all-NaN features,
        # graphs with no edges, or a numpy error that named no option.
        (
            "synthetic:products?nodes=300&signal=nan",
            r"^dataset synthetic:products: signal: must be a number in \[0, 1e6\], "
            r"got nan$",
        ),
        ("synthetic:products?nodes=300&signal=-1", r"signal: .*, got -1.0$"),
        (
            "synthetic:products?nodes=300&exponent=nan",
            r"exponent: must be a finite number > 1, got nan$",
        ),
        (
            "synthetic:products?nodes=300&train_fraction=nan",
            r"train_fraction: must be a number in \(0, 1\), got nan$",
        ),
        (
            "synthetic:rmat?scale=4&a=nan",
            r"^dataset synthetic:rmat: a: must be a finite number >= 0, got nan$",
        ),
        # Seeds: numpy's "expected non-negative integer" named no option, and
        # seeds past 2**63 (the limit of --seed) were taken.
        (
            "synthetic:products?nodes=300&seed=-1",
            r"^dataset synthetic:products: seed: expected an int in \[0, 2\*\*63\), "
            r"got -1$",
        ),
        ("synthetic:products?nodes=300&seed=1e20", r"seed: .*, got 1(0){20}$"),
        # A numpy MemoryError; and above 2**31 nodes, edge keys overflow int64.
        (
            "synthetic:products?nodes=1000000000000",
            r"nodes: must be in \[2, 2\*\*31\], got 1000000000000$",
        ),
        # Too big for memory: numpy's MemoryError, or "Maximum allowed
        # dimension exceeded", named no option.
        (
            "synthetic:products?nodes=3000&features=1000000000",
            r"^synthetic:products: nodes=3000 with degree=20.0, features=1000000000 "
            r"and classes=47 needs [0-9.]+ TiB of memory \(10.9 TiB for x, .*\), "
            r"more than this machine's 64 GiB$",
        ),
        (
            "synthetic:products?nodes=3000&features=1e30",
            r"^synthetic:products: .*features=1(0){30} and .* for x, ",
        ),
        (
            "synthetic:rmat?scale=20&edge_factor=100000",
            r"^synthetic:rmat: scale=20 with edge_factor=100000 and features=0 needs "
            r"2.29 TiB of memory \(2.29 TiB for the edge arrays, ",
        ),
    ],
)
def test_bad_synthetic_options_are_named(
    monkeypatch: pytest.MonkeyPatch, spec: str, message: str
) -> None:
    monkeypatch.setattr(synthetic, "_machine_memory", lambda: 64 << 30)
    with pytest.raises(ValueError, match=message):
        load_dataset(spec)


def test_integer_options_are_read_exactly() -> None:
    """Integers went through a float: ``seed=2**53 + 1`` became ``2**53``, a
    different graph with no word said."""
    seed = 2**53 + 1
    from_spec = load_dataset(f"synthetic:rmat?scale=4&edge_factor=2&seed={seed}")
    direct = rmat_graph(RmatConfig(scale=4, edge_factor=2, seed=seed))
    assert torch.equal(from_spec.indices, direct.indices)
    assert load_dataset(f"synthetic:rmat?scale=4&seed={2**63 - 1}").num_nodes == 16
    assert load_dataset("synthetic:rmat?scale=0.2e1&seed=1e1").num_nodes == 4
    with pytest.raises(ValueError, match="seed='3.0000000000000000001' is not an"):
        load_dataset("synthetic:rmat?scale=4&seed=3.0000000000000000001")


def test_a_path_object_loads_like_its_string(tmp_path: Path) -> None:
    """``load_dataset(Path(...))`` failed with "'PosixPath' object has no
    attribute 'partition'"."""
    folder = save_graph(Graph.from_edge_index([0, 1], [1, 2]), tmp_path / "g")
    assert load_dataset(folder).num_edges == 2
    with pytest.raises(TypeError, match="expected a spec string or a path, found"):
        load_dataset(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("edgelist:{dir}/e.txt?num_nodes=ten", r"num_nodes='ten' is not an int >= 0"),
        ("edgelist:{dir}/e.txt?num_nodes=-3", r"num_nodes='-3' is not an int >= 0"),
        ("ogb:{dir}?split=time", r"ogb: unknown option\(s\) \['split'\]; known"),
    ],
)
def test_a_bad_option_is_named(tmp_path: Path, spec: str, message: str) -> None:
    (tmp_path / "e.txt").write_text("0 1\n1 2\n")
    with pytest.raises(ValueError, match=message):
        load_dataset(spec.format(dir=tmp_path))
