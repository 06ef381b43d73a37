"""``graphwire simulate``: a small sweep end to end, and bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphwire.cli import main
from tests.cli_helpers import TINY


def test_a_sweep_prints_its_tables_and_writes_outcomes_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    code = main(
        [
            "simulate", "--dataset", TINY, "--workers-sweep", "2,4",
            "--exchange", "halo,straw", "--switch-mb", "0.001,1",
            "--simulator", "flow", "--link", "1Gbps", "--hidden", "8",
            "--out", str(out), "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "simulated epoch" in printed and "communication time per layer" in printed
    outcomes = json.loads((out / "outcomes.json").read_text())
    labels = {(o["label"], o["workers"]) for o in outcomes}
    assert labels == {
        (label, w) for label in ("halo", "straw 0.001MiB", "straw 1MiB") for w in (2, 4)
    }
    for o in outcomes:
        assert o["simulator"] == "flow" and o["epoch_s"] > 0 and o["bytes"] > 0
        assert o["epoch_s"] >= o["compute_s"]
    small = {o["workers"]: o for o in outcomes if o["label"] == "straw 0.001MiB"}
    big = {o["workers"]: o for o in outcomes if o["label"] == "straw 1MiB"}
    # Too little memory: rows overflow raw, one copy per destination.
    assert small[4]["switch"]["raw"] > 0 == big[4]["switch"]["raw"]
    assert small[4]["bytes"] > big[4]["bytes"]
    assert sorted(p.name for p in out.glob("*.png")) == [
        "epoch_vs_workers.png",
        "traffic_vs_memory.png",
    ]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--topology", "ring"], "unknown topology 'ring'"),
        (["--link", "0Gbps"], "link rate '0Gbps' must be above zero"),
        (["--topology", "leaf-spine:3x3"], "do not split evenly"),
        (["--parts", "400"], "more parts than the 300 nodes"),
        (["--parts", "8", "--hosts", "4"], "more parts than the topology's 4 hosts"),
        (["--exchange", "halo,teleport"], "--exchange: exchange: unknown 'teleport'"),
        (["--switch-mb", "0"], "--switch-mb 0: each must be above 0"),
        (["--calibrate", "nowhere"], "--calibrate nowhere: no metrics.jsonl"),
        (["--model", "gat", "--exchange", "switch"], "only with --model gcn or sage"),
    ],
)
def test_bad_input_is_refused_in_a_line(
    flags: list[str], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["simulate", "--dataset", TINY, "--simulator", "flow", "--quiet"]
    assert main(base + flags) == 2
    err = capsys.readouterr().err
    assert why in err and err.count("\n") == 1


def test_a_missing_ns3_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from graphwire.simulate import packet

    def missing() -> None:
        raise packet.SimulatorMissing(
            "ns-3 is not installed: pip install 'graphwire[sim]'"
        )

    monkeypatch.setattr(packet, "import_ns3", missing)
    argv = ["simulate", "--dataset", TINY, "--simulator", "ns3", "--quiet"]
    assert main(argv) == 2
    assert "--simulator ns3: ns-3 is not installed: pip install 'graphwire[sim]'" in (
        capsys.readouterr().err
    )
