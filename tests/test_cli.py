"""The graphwire command: help, config files, bench, error exits."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from graphwire.cli import build_parser, main
from graphwire.partition import PARTITIONERS
from graphwire.sigterm import STOP_SIGNALS
from tests.cli_helpers import SMALL
from tests.signals import default_stop_signals

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_the_commands(capsys) -> None:
    # In this process: `python -m graphwire` itself runs in the tests that
    # start it (test_a_write_cut_short_is_one_line_naming_the_file, ...).
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command in ("data", "partition", "train", "bench"):
        assert command in out


def test_a_command_without_its_subcommand_says_so(capsys) -> None:
    with pytest.raises(SystemExit):  # argparse's usage error, exit 2
        main(["data"])
    err = capsys.readouterr().err  # it named the attribute, data_command
    assert "the following arguments are required: SUBCOMMAND" in err


def test_a_write_cut_short_is_one_line_naming_the_file(tmp_path) -> None:
    """A full disk (here a file size limit) ended in numpy's traceback,
    ``OSError: 3880564 requested and 511968 written``, naming no file, and
    left the folder ``big`` the command had made."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))

    done = subprocess.run(
        [sys.executable, "-m", "graphwire", "data", "generate", "--dataset", SMALL]
        + ["--out", str(tmp_path / "big" / "g")],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()[-1:]
    assert "Traceback" not in done.stderr
    assert (
        line.startswith("graphwire: error: ") and ".npy: could not be written (" in line
    )
    assert list(tmp_path.iterdir()) == []


def test_an_error_is_one_write(monkeypatch) -> None:
    """The ranks torchrun starts on a node share its stderr: an error line
    written in two pieces (``print`` writes the newline apart) ran into the
    next rank's."""
    writes: list[str] = []

    class Stream:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    assert main(["data", "info", "--dataset", "synthetic:products?nodes=x"]) == 2
    assert len(writes) == 1, writes
    assert writes[0].startswith("graphwire: error: dataset ")
    assert writes[0].endswith("is not an integer\n")


def test_config_file_keys_must_be_known(tmp_path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: gcn\ncolour: blue\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown key 'colour'" in capsys.readouterr().err
    for text in ("- not a mapping\n", "[]\n", "0\n", "false\n", "''\n"):
        config.write_text(text)  # the last four were taken for no settings
        assert main(["train", "--config", str(config)]) == 2
        assert "expected a mapping" in capsys.readouterr().err
    config.write_text("help: true\n")  # a flag, but no setting
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown key 'help'" in capsys.readouterr().err
    config.write_text("model: gcn\nepochs: 3\nmodel: sage\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "found the key 'model' twice" in err
    assert "line 3, column 1" in err
    config.write_text("[" * 100_000)  # was a RecursionError traceback
    assert main(["train", "--config", str(config)]) == 2
    assert "not valid YAML: nested too deeply" in capsys.readouterr().err
    config.write_text("batch-size: 8\nbatch_size: 16\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "keys 'batch-size' and 'batch_size' set the same flag" in err
    config.write_bytes(b"\x00\xff\xfe model: gcn\n")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"graphwire: error: --config {config}: not a text file (UTF-8)" in err


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("epochs: lots\n", "epochs: expected int, got 'lots'"),
        ("epochs: 2.5\n", "epochs: expected int, got 2.5"),
        ("keep-checkpoints: true\n", "keep-checkpoints: expected int, got True"),
        ("exchange: mesh\n", "exchange: expected one of halo, replicate, g3"),
        ("quiet: 1\n", "quiet: expected true or false, got 1"),
        ("fanouts: {a: 1}\n", "fanouts: expected a single value"),
    ],
)
def test_config_file_values_are_checked_as_flags_are(
    tmp_path, capsys, text, error
) -> None:
    """A YAML value goes through its flag's type and choices, so a bad one is
    an error naming the file and key, not a TypeError deep in the run."""
    config = tmp_path / "run.yaml"
    config.write_text(text)
    assert main(["train", "--config", str(config)]) == 2
    assert f"graphwire: error: --config {config}: {error}" in capsys.readouterr().err


def _given(argv: list[str]) -> tuple[dict, dict]:
    """The values ``graphwire train ARGV`` gives, and where each came from."""
    from graphwire.commands.train import flag_table, given_values

    return given_values(flag_table(), build_parser().parse_args(argv))


def _command_actions(
    parser: argparse.ArgumentParser, command: str
) -> dict[str, argparse.Action]:
    """The flags of ``command``'s subparser, by attribute name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a for a in action.choices[command]._actions}
    return {}


def test_config_file_values_become_the_flags_types(tmp_path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("lr: '0.05'\nseed: 7\ndataset: 12\nresume: false\n")
    values, sources = _given(["train", "--config", str(config), "--seed", "3"])
    assert (values["lr"], values["seed"], values["dataset"]) == (0.05, 3, "12")
    assert values["resume"] is False
    assert set(sources) == {"lr", "dataset", "resume"}


def test_an_abbreviated_flag_wins_over_the_config_file_too(tmp_path) -> None:
    """argparse takes ``--epoch`` for ``--epochs``; the file's value won, so
    the run trained with settings other than those typed, and said nothing."""
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 1\nbatch_size: 16\nfanouts: [3, 3]\n# a comment\n")
    argv = ["train", "--config", str(config), "--epoch", "2", "--batch", "64"]
    values, sources = _given(argv)
    assert (values["epochs"], values["batch_size"], values["fanouts"]) == (2, 64, "3,3")
    assert set(sources) == {"fanouts"}
    config.write_text("# nothing set yet\n")  # no settings: the defaults
    values, sources = _given(["train", "--config", str(config)])
    assert sources == {} and "epochs" not in values


def test_a_distributed_flag_from_a_config_file_is_named_with_it(
    tmp_path, capsys
) -> None:
    """A shared config file's distributed settings on a one-process run: the
    refusal says they came from the file."""
    config = tmp_path / "run.yaml"
    config.write_text("exchange: g3\ntimeout: 600\n")
    argv = ["train", "--config", str(config), "--dataset", str(tmp_path / "x")]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"--exchange (in {config}) / --timeout (in {config}): only for" in err


def test_bench_list(capsys) -> None:
    assert main(["bench", "list"]) == 0
    assert "gcn-epoch" in capsys.readouterr().out


def test_partition_help_names_every_registered_partitioner(capsys) -> None:
    for command in ("partition", "train"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        for name in PARTITIONERS:
            assert name in text, (command, name)


# A launcher's worker running the CLI, with a thread that never ends: a normal
# interpreter exit would wait for it forever (as it can abort on gloo's threads).
_LAUNCHED_CLI = """
import atexit, runpy, sys, threading
threading.Thread(target=threading.Event().wait).start()
atexit.register(print, "atexit handlers ran")
sys.argv = ["graphwire", *sys.argv[1:]]
runpy.run_module("graphwire", run_name="__main__")
"""


def test_under_a_launcher_the_cli_exits_without_interpreter_teardown(
    monkeypatch,
) -> None:
    """A command that succeeds and one that fails (a flag refused), at once."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # stdout: a buffered pipe
    cases = [(SMALL, 0, "3,000"), ("synthetic:products?nodes=x", 2, "nodes='x'")]
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _LAUNCHED_CLI, "data", "info", "--dataset", dataset],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for dataset, _, _ in cases
    ]
    try:
        outputs = [run.communicate(timeout=120) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
    for (dataset, code, said), run, (out, err) in zip(
        cases, runs, outputs, strict=True
    ):
        assert run.returncode == code, dataset
        assert said in out + err, dataset
        # atexit handlers still run, and output is flushed before the process ends.
        assert out.rstrip().endswith("atexit handlers ran"), dataset


@pytest.mark.parametrize("command", ["partition", "train", "bench"])
def test_every_flag_has_help(command: str) -> None:
    actions = _command_actions(build_parser(), command)
    missing = [a.dest for a in actions.values() if not a.help]
    assert missing == []


@pytest.mark.parametrize("command", ["generate", "info", "verify"])
def test_every_data_flag_has_help(command: str) -> None:
    data = _command_actions(build_parser(), "data")["data_command"]
    assert isinstance(data, argparse._SubParsersAction)
    parser = data.choices[command]
    assert [a.dest for a in parser._actions if not a.help] == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--seed", "-1"], "--seed: expected an int in [0, 2**63), got -1"),
        (["--nodes", "3000000000"], "--nodes: need 100 to 2**31, got 3000000000"),
        (["--nodes", "99"], "--nodes: need 100 to 2**31, got 99"),
        (["--repeat", "0"], "--repeat: need at least 1, got 0"),
    ],
)
def test_bench_bad_options_are_named_by_their_flags(capsys, flags, said) -> None:
    # The generator benchmark used to die in its child process (a traceback).
    assert main(["bench", "generator", "--nodes", "200", *flags]) == 2
    assert capsys.readouterr().err == f"graphwire: error: {said}\n"


def test_out_of_memory_is_one_line(tmp_path, capsys, cora_dir, monkeypatch) -> None:
    """torch's failed CPU allocation (a huge --hidden) and numpy's
    MemoryError were tracebacks; now one line saying what was asked for."""
    argv = ["train", "--dataset", f"planetoid:{cora_dir}/cora", "--quiet"]
    argv += ["--model", "gcn", "--hidden", "100000000000", "--epochs", "1"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err == (
        "graphwire: error: out of memory: you tried to allocate "
        f"{1433 * 100_000_000_000 * 4} bytes\n"
    ), err

    def numpy_runs_out(args):
        # 256 PiB: beyond any x86-64 or arm64 address space, so it fails
        # also where memory is overcommitted (8 TiB did not fail on a GPU
        # host, likely for that reason)
        return np.zeros(2**55)

    import graphwire.commands.data

    monkeypatch.setattr(graphwire.commands.data, "info", numpy_runs_out)
    assert main(["data", "info", "--dataset", "synthetic:products"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("graphwire: error: out of memory: Unable to allocate"), err


def test_bench_script_help_is_its_own() -> None:
    script = REPO_ROOT / "benchmarks" / "bench_sampler.py"
    out = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    ).stdout
    assert out.startswith("usage: bench_sampler.py [-h] [--nodes NODES]")
    assert "`graphwire bench sampler`" in out
    assert "name" not in out.split("\n\n")[0]  # the script passes the NAME itself


def test_sigterm_or_sighup_ends_a_command_as_ctrl_c_does(tmp_path) -> None:
    """``timeout``, a job scheduler or ``kill PID`` send SIGTERM, a closed
    terminal SIGHUP: their default ended ``graphwire data generate`` or
    ``partition`` mid-write with the temporary folder left beside the target
    (``.NAME.*.tmp``). Now the clean-up runs: one line, exit 130, nothing
    left. One command per signal, at once."""
    spec = "synthetic:products?nodes=200000"
    folders = [tmp_path / stop.name for stop in STOP_SIGNALS]
    processes = []
    for folder in folders:
        folder.mkdir()
        command = [sys.executable, "-m", "graphwire", "data", "generate"]
        command += ["--dataset", spec, "--out", str(folder / "g")]
        processes.append(
            subprocess.Popen(
                command,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=default_stop_signals,
            )
        )
    try:
        waiting = dict(
            zip(STOP_SIGNALS, zip(folders, processes, strict=True), strict=True)
        )
        while waiting:  # each about 2 s in, writing for 0.7 s
            for stop, (folder, process) in list(waiting.items()):
                assert process.poll() is None, f"{stop.name}: ended before it wrote"
                if list(folder.glob(".g.*.tmp")):
                    process.send_signal(stop)
                    del waiting[stop]
            time.sleep(0.01)
        errors = [process.communicate(timeout=60)[1] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for folder, process, stderr in zip(folders, processes, errors, strict=True):
        assert process.returncode == 130, stderr
        assert stderr.strip().splitlines()[-1] == "graphwire: interrupted"
        assert list(folder.iterdir()) == []


def test_stop_signals_are_back_at_their_defaults_once_the_command_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``main()`` takes SIGTERM and SIGHUP as Ctrl-C while its command runs,
    and gives them back their defaults when it returns: ``torchrun`` sends
    SIGTERM to the workers still up once one has failed, and one that came
    after the command had printed its one-line error raised
    ``KeyboardInterrupt`` outside it, a traceback. A handler main() did not
    install stays."""
    seen: list[object] = []

    def command(argv: list[str]) -> int:
        seen.extend(signal.getsignal(s) for s in STOP_SIGNALS)
        return 3

    monkeypatch.setattr("graphwire.cli._main", command)
    try:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        assert main() == 3
        assert seen and signal.SIG_DFL not in seen  # taken over while it ran
        assert seen[0] is seen[1]  # SIGHUP handled as SIGTERM is
        assert [signal.getsignal(s) for s in STOP_SIGNALS] == [signal.SIG_DFL] * 2
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        assert main() == 3
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)


def test_under_a_launcher_a_failed_join_is_one_line(tmp_path) -> None:
    """A rank whose master never comes up: torch's C++ log (a page of
    ``frame #`` lines before the error) is off under a launcher unless the
    user set its level, so stderr is graphwire's one line naming the rank."""
    from graphwire.comm.launch import free_port

    parts = tmp_path / "parts"
    argv = ["partition", "--dataset", SMALL, "--method", "random", "--parts", "2"]
    assert main([*argv, "--out", str(parts)]) == 0
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    env |= {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "graphwire", "train", "--dataset", str(parts)]
        + ["--quiet", "--timeout", "2", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.startswith("graphwire: error: rank 1: joining 2 ranks at ")
    assert done.stderr.count("\n") == 1, done.stderr


def _leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every runnable command's parser (``data generate``, ``partition``, ...)."""
    subparsers = [
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ]
    if not subparsers:
        return {path: parser}
    leaves = {}
    for name, sub in subparsers[0].choices.items():
        leaves |= _leaf_commands(sub, (*path, name))
    return leaves


def test_every_command_takes_quiet() -> None:
    """``--quiet`` is common to every command: ``partition --quiet`` and
    ``data ... --quiet`` stopped at the usage message."""
    leaves = _leaf_commands(build_parser())
    assert len(leaves) >= 7  # data generate/info/verify, partition, train, ...
    for path, parser in leaves.items():
        quiet = parser._option_string_actions.get("--quiet")
        assert isinstance(quiet, argparse._StoreTrueAction) and quiet.help, path


def test_quiet_leaves_each_commands_result_and_drops_its_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command run with ``--quiet``: no spinner's "done in" lines;
    its tables and its result line, as without it (train --quiet's rule)."""
    tiny = "synthetic:products?nodes=300&degree=4&features=4&classes=3&seed=1"
    graph, parts, run = tmp_path / "graph", tmp_path / "parts", tmp_path / "run"
    assert main(["data", "info", "--dataset", tiny]) == 0
    assert "done in" in " ".join(capsys.readouterr().out.split())  # --quiet's
    steps = [
        (["data", "info", "--dataset", tiny], "isolated nodes"),
        (["data", "generate", "--dataset", tiny, "--out", str(graph)], "saved to"),
        (["data", "verify", "--dataset", str(graph)], "matches its checksum"),
        (
            ["partition", "--dataset", str(graph), "--parts", "2", "--out", str(parts)],
            "partitioned graph:",
        ),
        (
            ["train", "--dataset", str(graph), "--epochs", "1", "--out", str(run)],
            "summary ",
        ),
        (["report", str(run)], "report:"),
        (["bench", "list"], "gcn-epoch"),
    ]
    for argv, said in steps:
        assert main([*argv, "--quiet"]) == 0, argv
        printed = " ".join(capsys.readouterr().out.split())  # rich wraps lines
        assert "done in" not in printed, argv
        assert said in printed, argv
