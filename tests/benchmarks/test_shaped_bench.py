"""shaped_bench.train_runs: runs given together start at once, and a failed
one is raised only after every run has ended."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import shaped_bench  # noqa: E402

# Stands in for `graphwire train ARGV --out OUT`: notes when it started and
# ended in OUT, exits with ARGV[0] and prints a summary line when that is 0.
FAKE_TRAIN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    code, out = int(sys.argv[2]), Path(sys.argv[-1])
    (out / "started").write_text(repr(time.monotonic()))
    time.sleep(float(sys.argv[3]))
    (out / "ended").write_text(repr(time.monotonic()))
    if code:
        sys.exit(code)
    print("epoch 0 ...")
    print(f"summary epoch_s_median={sys.argv[3]} test_acc=0.5")
    """
)


class FakeNet:
    """What train_runs asks of a ShapedNetwork, run outside any namespace."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []

    def popen(self, command: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(command, **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]


@pytest.fixture
def fake_cli(tmp_path, monkeypatch) -> FakeNet:
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(shaped_bench, "CLI", [sys.executable, str(script)])
    return FakeNet()


def test_runs_given_together_run_at_once(tmp_path, fake_cli) -> None:
    outs = [tmp_path / "a", tmp_path / "b"]
    runs = shaped_bench.train_runs(
        fake_cli,
        [["0", "1.5"], ["0", "1.5"]],
        outs,
        timeout_s=60,
    )
    assert [summary for summary, _ in runs] == [
        {"epoch_s_median": "1.5", "test_acc": "0.5"}
    ] * 2
    starts = [float((out / "started").read_text()) for out in outs]
    ends = [float((out / "ended").read_text()) for out in outs]
    assert max(starts) < min(ends)  # each began before either ended
    assert all(wall >= 1.5 for _, wall in runs)


def test_a_failed_run_is_raised_after_the_others_end(tmp_path, fake_cli) -> None:
    outs = [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(
        shaped_bench.RunFailed, match=r"fake_train.py train 3 0.1 .* exited 3"
    ):
        shaped_bench.train_runs(
            fake_cli,
            [["3", "0.1"], ["0", "1"]],
            outs,
            timeout_s=60,
        )
    assert (outs[1] / "ended").exists()  # the good run was let finish
    assert not fake_cli.pids()


def test_runs_past_the_limit_are_killed_and_named(tmp_path, fake_cli) -> None:
    outs = [tmp_path / "a", tmp_path / "b"]
    killed: list[object] = []

    def kill(net: FakeNet, grace_s: float = 2.0) -> None:
        killed.append(net)
        for proc in net.procs:
            proc.kill()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shaped_bench, "kill_namespace_processes", kill)
        with pytest.raises(shaped_bench.RunFailed, match=r"ran past 1s \(killed\)"):
            shaped_bench.train_runs(
                fake_cli,
                [["0", "30"], ["0", "30"]],
                outs,
                timeout_s=1,
            )
    assert killed and not fake_cli.pids()
    assert not (outs[0] / "ended").exists()


def test_a_runs_summary_line_is_read_or_its_absence_named() -> None:
    stdout = "epoch 1 ...\nsummary test_acc=0.81 epochs=3 seeds_per_s=12.5\n"
    fields = shaped_bench.summary_fields(stdout, "the run")
    assert fields == {"test_acc": "0.81", "epochs": "3", "seeds_per_s": "12.5"}
    with pytest.raises(shaped_bench.RunFailed, match="the run: no summary line"):
        shaped_bench.summary_fields("epoch 1 ...\n", "the run")
