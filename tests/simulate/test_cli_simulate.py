"""``graphwire simulate``: a small sweep end to end, and bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphwire.cli import main
from graphwire.simulate.sweep import calibrated_compute
from tests.cli_helpers import TINY


def test_a_sweep_prints_its_tables_and_writes_outcomes_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim"
    code = main(
        [
            "simulate", "--dataset", TINY, "--workers-sweep", "2,4",
            "--exchange", "halo,straw", "--switch-mb", "0.001,1",
            "--simulator", "both", "--link", "1Gbps", "--hidden", "8",
            "--repeats", "1", "--out", str(out), "--quiet",
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "simulated epoch" in printed and "communication time per layer" in printed
    outcomes = json.loads((out / "outcomes.json").read_text())
    labels = [(o["label"], o["workers"], o["simulator"]) for o in outcomes]
    assert sorted(labels) == sorted(
        (label, w, sim)
        for label in ("halo", "straw 0.001MiB", "straw 1MiB")
        for w in (2, 4)
        for sim in ("ns-3", "flow")
    )
    for o in outcomes:
        assert o["epoch_s"] > 0 and o["bytes"] > 0
        assert o["epoch_s"] >= o["compute_s"] * (1 - 1e-9)  # (float sums)
    # ns-3 has queues: the switch's egress queue held packets at some point.
    assert any(o["peak_queue"] > 0 for o in outcomes if o["simulator"] == "ns-3")
    flow = [o for o in outcomes if o["simulator"] == "flow"]
    small = {o["workers"]: o for o in flow if o["label"] == "straw 0.001MiB"}
    big = {o["workers"]: o for o in flow if o["label"] == "straw 1MiB"}
    # Too little memory: rows overflow raw, one copy per destination.
    assert small[4]["switch"]["raw"] > 0 == big[4]["switch"]["raw"]
    assert small[4]["switch"]["resent"] == 0  # lossless: nothing sent twice
    assert small[4]["bytes"] > big[4]["bytes"]
    assert sorted(p.name for p in out.glob("*.png")) == [
        "epoch_vs_workers.png",
        "queue.png",
        "traffic_vs_memory.png",
    ]


def test_calibration_reads_each_ranks_median_compute(tmp_path: Path) -> None:
    records = [{"kind": "config"}]
    for epoch, busy in enumerate([(9.0, 9.0), (2.0, 3.0), (4.0, 5.0), (3.0, 4.0)]):
        for rank in (0, 1):
            times = {"forward_s": busy[rank], "backward_s": 1.0, "comm_s": 0.5}
            records.append(
                {"kind": "epoch", "epoch": epoch, "rank": rank, "times": times}
            )
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, records)))
    # Epoch 0 left out; forward + backward - comm, median over the rest.
    assert calibrated_compute(str(tmp_path)) == [3.5, 4.5]
    (tmp_path / "metrics.jsonl").write_text('{"kind": "epoch", "rank": 0}\n')
    with pytest.raises(ValueError, match="line 1 has no forward_s"):
        calibrated_compute(str(tmp_path))


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
        (["--repeats", "0"], "--repeats: expected >= 1, got 0"),
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
