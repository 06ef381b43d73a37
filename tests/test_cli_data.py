"""`graphwire data` and `graphwire partition`: the folders they write, what
verify finds in them, and the outputs they refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphwire.cli import main
from graphwire.graph.datasets import load_dataset
from graphwire.partition import (
    LocalityPartitioner,
    load_part,
    load_partition_meta,
)
from graphwire.partition.locality import RefineResult
from graphwire.run.partitioning import refinement_line
from tests.cli_helpers import SMALL, TINY


def test_data_generate_then_info(tmp_path, capsys) -> None:
    folder = tmp_path / "g"
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(folder)]) == 0
    assert (folder / "meta.json").exists()
    assert main(["data", "info", "--dataset", str(folder)]) == 0
    assert "3,000" in capsys.readouterr().out
    # Refuses to overwrite without --overwrite, and says why.
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(folder)]) == 2
    assert "already exists" in capsys.readouterr().err
    # `data verify` reads every byte of a graph folder too.
    assert main(["data", "verify", "--dataset", str(folder)]) == 0
    assert "every array matches its checksum" in capsys.readouterr().out
    features = folder / "x.npy"
    data = bytearray(features.read_bytes())
    data[-1] ^= 0xFF
    features.write_bytes(bytes(data))
    assert main(["data", "verify", "--dataset", str(folder)]) == 2
    assert f"{features}: checksum mismatch" in capsys.readouterr().err


def test_bad_dataset_is_a_clear_error(capsys) -> None:
    assert main(["data", "info", "--dataset", "synthetic:products?nodes=x"]) == 2
    assert "nodes='x'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "said"),
    [
        ("signal=nan", "signal: must be a number in [0, 1e6], got nan"),  # was NaN x
        ("seed=-1", "seed: expected an int in [0, 2**63), got -1"),
        ("features=1000000000", "10.9 TiB for x"),  # was a MemoryError traceback
    ],
)
def test_data_info_names_a_bad_synthetic_option(capsys, option: str, said: str) -> None:
    spec = f"synthetic:products?nodes=3000&{option}"
    assert main(["data", "info", "--dataset", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("graphwire: error: ") and said in err


def test_partition_command_writes_loadable_parts(tmp_path, capsys) -> None:
    out = tmp_path / "parts"
    argv = ["partition", "--dataset", SMALL, "--method", "metis", "--parts", "3"]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "edge cut" in text and "max/mean" in text
    meta = load_partition_meta(out)
    assert meta["num_parts"] == 3 and meta["node_order"] == "rcm"  # the default
    owned = sum(load_part(out, p).num_owned for p in range(3))
    assert owned == 3000
    by_id = tmp_path / "by-id"
    assert main([*argv, "--node-order", "id", "--out", str(by_id)]) == 0
    assert load_partition_meta(by_id)["node_order"] == "id"
    for part_id in range(3):  # the same parts, numbered otherwise
        rcm, ids = load_part(out, part_id), load_part(by_id, part_id)
        assert ids.orig_nid.tolist() == sorted(rcm.orig_nid.tolist())
        assert ids.orig_nid.tolist() != rcm.orig_nid.tolist()
    capsys.readouterr()
    # `data verify` checks every byte against meta.json's sums.
    assert main(["data", "verify", "--dataset", str(out)]) == 0
    assert "all 3 parts match their checksums" in capsys.readouterr().out
    features = out / "part_2" / "x.npy"
    data = bytearray(features.read_bytes())
    data[-1] ^= 0xFF  # one bit pattern of one feature: sizes still agree
    features.write_bytes(bytes(data))
    assert load_part(out, 2).num_owned > 0  # loading does not read every byte
    assert main(["data", "verify", "--dataset", str(out)]) == 2
    assert f"{features}: checksum mismatch" in capsys.readouterr().err
    assert main(["data", "verify", "--dataset", SMALL]) == 2
    assert "no such folder (verify checks a folder from" in capsys.readouterr().err
    # One process cannot train it: the error says how.
    assert main(["train", "--dataset", str(out), "--quiet"]) == 2
    said = "a partitioned graph (3 parts); train it with --workers 3"
    assert said in capsys.readouterr().err
    # An unknown method is a clear error, not a traceback.
    assert main(["partition", "--dataset", SMALL, "--method", "spectral"]) == 2
    assert (
        "--method spectral: unknown; expected one of blocks," in capsys.readouterr().err
    )


def test_partition_refuses_to_destroy_its_input(tmp_path, capsys) -> None:
    """--out may not be the input folder, hold it or lie in it, even with
    --overwrite; the input is left as it was."""
    source = tmp_path / "g"
    assert main(["data", "generate", "--dataset", TINY, "--out", str(source)]) == 0
    before = sorted(p.name for p in source.iterdir())
    argv = ["partition", "--dataset", str(source), "--parts", "2", "--overwrite"]
    for out, said in [
        (source, "holds the input"),
        (tmp_path, "holds the input"),
        (source / "parts", "lies inside the input"),
    ]:
        capsys.readouterr()
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"graphwire: error: --out {out}: {said}"), err
        assert sorted(p.name for p in source.iterdir()) == before
    assert main(["data", "info", "--dataset", str(source)]) == 0


def test_a_planetoid_folder_takes_outputs_beside_its_files(
    tmp_path, capsys, cora_dir
) -> None:
    """A planetoid spec reads ``ind.cora.*`` only: an output may be written
    into its folder, but not over the folder itself."""
    folder = tmp_path / "planetoid"
    folder.mkdir()
    for source in cora_dir.glob("ind.cora.*"):  # linked, not copied
        (folder / source.name).symlink_to(source)
    spec = f"planetoid:{folder}/cora"
    argv = ["data", "generate", "--dataset", spec, "--overwrite", "--out"]
    assert main([*argv, str(folder / "cora-gw")]) == 0
    capsys.readouterr()
    assert main([*argv, str(folder)]) == 2
    assert f"--out {folder}: holds the input" in capsys.readouterr().err
    assert len(list(folder.glob("ind.cora.*"))) == 8


def test_partition_overwrites_only_graphwire_folders(tmp_path, capsys) -> None:
    argv = ["partition", "--dataset", TINY, "--parts", "2", "--out"]
    kept = tmp_path / "afile"
    kept.write_text("keep me")
    assert main([*argv, str(kept), "--overwrite"]) == 2
    assert f"--out {kept}: is a file, not a folder" in capsys.readouterr().err
    assert main([*argv, str(kept / "sub")]) == 2  # before any work, as train's
    assert f"--out {kept / 'sub'}: is under {kept}" in capsys.readouterr().err
    assert kept.read_text() == "keep me"
    # An existing folder is refused before the partition is computed.
    out = tmp_path / "parts"
    assert main([*argv, str(out)]) == 0
    capsys.readouterr()
    assert main([*argv, str(out)]) == 2
    done = capsys.readouterr()
    assert "already exists (pass --overwrite to replace it)" in done.err
    assert "partition: " not in done.out  # no table: nothing was computed
    assert main([*argv, str(out), "--overwrite"]) == 0


def test_more_parts_than_nodes_is_refused_naming_parts(tmp_path, capsys) -> None:
    """The partitioner said 'num_parts: must be <= ...', a name never typed."""
    out = tmp_path / "run"
    for argv in (
        ["partition", "--dataset", TINY, "--parts", "5000"],
        ["train", "--dataset", TINY, "--partition", "random", "--parts", "5000"]
        + ["--quiet", "--out", str(out)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"--parts 5000: more than the 300 nodes of {TINY}" in err, err
    assert not out.exists()


def test_locality_partition_reports_what_the_refinement_did(tmp_path, capsys) -> None:
    assert main(["partition", "--dataset", SMALL, "--method", "locality"]) == 0
    text = capsys.readouterr().out
    expected = LocalityPartitioner()
    expected.partition(load_dataset(SMALL), 4, seed=0)
    assert expected.last_refinement is not None
    # All but the seconds it took.
    assert refinement_line(expected.last_refinement).rsplit(", ", 1)[0] in text
    assert text.count("locality refinement:") == text.count("partition: ") == 1
    # A single-process run with --partition locality logs it as well.
    out = tmp_path / "run"
    argv = ["train", "--dataset", SMALL, "--epochs", "1", "--quiet"]
    assert main([*argv, "--partition", "locality", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    logged = next(r for r in records if r["kind"] == "partition")
    summary = expected.last_refinement.summary()
    assert {k: logged[f"refine_{k}"] for k in summary if k != "seconds"} == {
        k: v for k, v in summary.items() if k != "seconds"
    }


def _refinement(halo: tuple[int, ...], cut_before: int, cut_after: int):
    return RefineResult(
        halo_before=halo,
        halo_after=halo,
        degree_sum_before=(4,) * len(halo),
        degree_sum_after=(4,) * len(halo),
        edge_cut_before=cut_before,
        edge_cut_after=cut_after,
        num_swaps=0,
        num_rejected=0,
        stop_reason="converged",
        seconds=0.0,
    )


@pytest.mark.parametrize(
    ("result", "said"),
    [
        # --parts 1: no halo, no cut; not "0 -> 0 (-100.0%)".
        (_refinement((0,), 0, 0), "halo max/min 1.000 -> 1.000, edge cut 0 -> 0, "),
        # A tiny graph with a part that reads no other: not "inf -> inf".
        (
            _refinement((0, 3), 4, 5),
            "halo max/min n/a -> n/a (n/a: a part with no halo), edge cut 4 -> 5 "
            "(+25.0%), ",
        ),
        (_refinement((2, 3), 4, 2), "halo max/min 1.500 -> 1.500, edge cut 4 -> 2 ("),
    ],
    ids=["one part", "a part without halo", "usual"],
)
def test_refinement_line_says_only_true_numbers(result, said: str) -> None:
    assert said in refinement_line(result)


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--method", "bogus"], "--method bogus: unknown; expected one of blocks,"),
        (["--parts", "0"], "--parts: expected >= 1, got 0"),
        (["--seed", "-1"], "--seed: expected an int in [0, 2**63), got -1"),
        (["--overwrite"], "--overwrite: only with --out"),
        (["--node-order", "id"], "--node-order: only with --out"),
    ],
    ids=repr,
)
def test_partition_settings_are_refused_before_the_graph_is_read(
    tmp_path, capsys, flags, error
) -> None:
    """They were checked only after the graph was read or generated (long,
    for a large one); --overwrite without --out was ignored. The dataset
    does not even exist."""
    argv = ["partition", "--dataset", str(tmp_path / "missing"), *flags]
    assert main(argv) == 2
    assert f"graphwire: error: {error}" in capsys.readouterr().err


def test_verify_names_what_is_wrong_with_a_folder(tmp_path, capsys) -> None:
    """It said 'not a graphwire folder' for a missing path, a damaged
    meta.json and a parts folder without part_0; a meta.json nested deeply
    was a RecursionError traceback (info, verify, --overwrite)."""
    graph, parts = tmp_path / "g", tmp_path / "p"
    assert main(["data", "generate", "--dataset", SMALL, "--out", str(graph)]) == 0
    assert (
        main(
            ["partition", "--dataset", str(graph), "--parts", "2"]
            + ["--out", str(parts)]
        )
        == 0
    )
    (parts / "part_0").rename(tmp_path / "moved")
    capsys.readouterr()

    def error(*argv: str) -> str:
        assert main(list(argv)) == 2
        return capsys.readouterr().err

    verify = ["data", "verify", "--dataset"]
    assert f"{tmp_path / 'none'}: no such folder" in error(
        *verify, str(tmp_path / "none")
    )
    assert f"{parts / 'part_0'} is missing" in error(*verify, str(parts))
    (graph / "meta.json").write_text("[" * 100_000)
    for argv in (
        [*verify, str(graph)],
        ["data", "info", "--dataset", str(graph)],
    ):
        assert "meta.json: not valid JSON (maximum recursion depth" in error(*argv)
    generate = ["data", "generate", "--dataset", SMALL, "--out", str(graph)]
    assert "refusing to replace it" in error(*generate, "--overwrite")


def _resave_part_array(parts: Path, part: int, name: str, array) -> None:
    """Write ``part_<part>/<name>.npy`` with its checksum and shape in
    meta.json updated, as a careful tamperer would."""
    import hashlib

    import numpy as np

    path = parts / f"part_{part}" / f"{name}.npy"
    np.save(path, array)
    meta = json.loads((parts / "meta.json").read_text())
    spec = meta["parts"][part]["arrays"][name]
    spec["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    spec["shape"] = list(array.shape)
    (parts / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage",
    [
        "no labels in part 0",
        "repeated training node",
        "node owned twice",
        "owned halo node",
        "num_classes",
    ],
)
def test_verify_finds_parts_that_disagree_with_checksums_intact(
    tmp_path, capsys, damage
) -> None:
    """Each passed 'all parts match their checksums': meta.json has none of
    its own, and only IDs were range-checked."""
    import numpy as np

    parts = tmp_path / "p"
    argv = ["partition", "--dataset", SMALL, "--parts", "2", "--out", str(parts)]
    assert main(argv) == 0
    meta = json.loads((parts / "meta.json").read_text())
    part0, part1 = (np.load(parts / f"part_{i}" / "orig_nid.npy") for i in (0, 1))
    if damage == "no labels in part 0":
        del meta["parts"][0]["arrays"]["y"]
        (parts / "meta.json").write_text(json.dumps(meta))
        said = "parts[1].arrays lists ['halo_nid', 'indices', 'indptr', 'orig_nid',"
    elif damage == "repeated training node":
        train = np.load(parts / "part_1" / "train_local.npy")
        _resave_part_array(parts, 1, "train_local", np.append(train, train[0]))
        said = "train_local.npy: holds a node twice"
    elif damage == "node owned twice":
        _resave_part_array(parts, 0, "orig_nid", np.append(part0[:-1], part1[0]))
        said = "own more than once 1 node(s), such as"
    elif damage == "owned halo node":
        halo = np.load(parts / "part_1" / "halo_nid.npy")
        start = meta["offsets"][1]
        below = int(np.searchsorted(halo, start)) - 1
        assert below >= 0 and (below + 1 == halo.size or halo[below + 1] > start)
        halo[below] = start
        _resave_part_array(parts, 1, "halo_nid", halo)
        said = f"halo_nid.npy: holds 1 nodes this part owns (global IDs [{start},"
    else:
        meta["num_classes"] = 50
        (parts / "meta.json").write_text(json.dumps(meta))
        said = "num_classes is 50, but the labels run to 3 (expected 4)"
    capsys.readouterr()
    assert main(["data", "verify", "--dataset", str(parts)]) == 2
    assert said in capsys.readouterr().err


def test_data_info_names_a_label_beyond_the_node_count(tmp_path, capsys) -> None:
    """A label of 10**9 on a 5-node graph read as 1,000,000,001 classes (and
    training then asked for 64 GB): the array and the label are named."""
    import numpy as np

    path = tmp_path / "g.npz"
    y = np.array([0, 1, 0, 10**9, 1])
    np.savez(path, src=np.array([0, 1, 2, 3]), dst=np.array([1, 2, 3, 4]), y=y)
    assert main(["data", "info", "--dataset", f"npz:{path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"graphwire: error: {path}: array 'y': the largest label is 1000000000 "
        "(row 3), but a graph of 5 nodes has at most 5 classes"
    ), err
