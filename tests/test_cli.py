"""The stage processes' clean failures (stages.core.cli.run)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from stages.core import cli
from stages.core.storage.atomic import HOST_TAG, atomic_path, destination_of, write_json

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("code", "where", "remedy"),
    [
        (errno.ENOSPC, "writing", "free some space"),
        (errno.EDQUOT, "writing", "free some space"),
        (errno.EROFS, "at", "check that location's permissions"),
        (errno.EACCES, "at", "check that location's permissions"),
        (errno.EPERM, "at", "check that location's permissions"),
    ],
)
def test_a_full_disk_or_unwritable_place_is_one_message_and_leaves_nothing_looking_finished(
    code: int,
    where: str,
    remedy: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dest = tmp_path / "experiments" / "a" / "senteval.json"

    def fails(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "write_text", fails)
    monkeypatch.setattr("sys.argv", ["stage"])
    with pytest.raises(SystemExit) as stop:
        cli.run(lambda argv: write_json(dest, {"sts_avg": 80.0}))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {os.strerror(code)} {where} {dest}. ")
    assert remedy in err and "Traceback" not in err
    assert list(dest.parent.iterdir()) == []  # neither the output nor a temporary


def full_disk_without_a_name() -> None:
    """What a write(2) that finds the disk full raises through Path.write_text or np.savez."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def full_disk_in_polars() -> None:
    raise pl.exceptions.ComputeError(
        "parquet: failed to write: No space left on device (os error 28)"
    )


def full_disk_as_polars_oserror() -> None:
    raise OSError("No space left on device (os error 28)")  # no errno


@pytest.mark.parametrize("writer", [full_disk_without_a_name, full_disk_in_polars,
                                    full_disk_as_polars_oserror])  # fmt: skip
def test_a_full_disk_is_named_whichever_writer_meets_it(
    writer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The errors as they come (the report's polars writers used to end in a traceback, a
    plain write in a message naming no file)."""
    dest = tmp_path / "reports" / "results"

    def report(argv: object) -> None:
        with atomic_path(dest) as tmp:
            tmp.mkdir()
            writer()

    monkeypatch.setattr("sys.argv", ["stage"])
    with pytest.raises(SystemExit) as stop:
        cli.run(report)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: No space left on device writing {dest}. ")
    assert list(dest.parent.iterdir()) == []


def test_a_file_read_inside_a_write_is_named_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """polars names the file it failed to read after its '(os error N)'."""
    dest, source = tmp_path / "reports" / "results", tmp_path / "unreadable.parquet"

    def report(argv: object) -> None:
        with atomic_path(dest):
            raise PermissionError(f"Permission denied (os error 13): {source}")  # no errno

    monkeypatch.setattr("sys.argv", ["stage"])
    with pytest.raises(SystemExit):
        cli.run(report)
    assert capsys.readouterr().err.startswith(f"error: Permission denied at {source}. ")


def test_a_temporary_that_cannot_be_made_is_named_by_its_output(tmp_path: Path) -> None:
    """mkdtemp in a read-only folder names the temporary it tried to make."""
    temporary = tmp_path / f".x.parquet.{HOST_TAG}-123.abc_1.tmp"
    assert destination_of(temporary) == tmp_path / "x.parquet"
    assert destination_of(temporary / "x.parquet") == tmp_path / "x.parquet"
    assert destination_of(tmp_path / "x.parquet") == tmp_path / "x.parquet"


def test_other_os_errors_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(argv: object) -> None:
        raise OSError(errno.EIO, "Input/output error", "/data/x")

    monkeypatch.setattr("sys.argv", ["stage"])
    with pytest.raises(OSError, match="Input/output error"):
        cli.run(broken)


def test_an_interrupt_says_what_is_kept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the stage cut short says itself (a note on the exception); without one, a rerun
    redoes it. Nothing names a placeholder."""

    def interrupted(argv: object) -> None:
        raise KeyboardInterrupt

    def interrupted_training(argv: object) -> None:
        stop = KeyboardInterrupt()
        stop.add_note("run 0123 (x) stays unfinished in runs/0123.partial; a rerun resumes it")
        raise stop

    monkeypatch.setattr("sys.argv", ["stage"])
    for stage, kept in (
        (interrupted, "a rerun redoes what was cut short"),
        (interrupted_training, "run 0123 (x) stays unfinished in runs/0123.partial; a rerun"),
    ):
        with pytest.raises(SystemExit) as stop:
            cli.run(stage)
        assert stop.value.code == 130
        err = capsys.readouterr().err
        assert f"nothing cut short looks finished; {kept}" in err
        assert "<" not in err and "discarded" not in err


INTERRUPT_AN_IMPORT = """
import sys

class Interrupt:  # Ctrl-C arriving while the stage imports polars
    def find_spec(self, name, path=None, target=None):
        if name == "polars":
            raise KeyboardInterrupt

sys.meta_path.insert(0, Interrupt())
"""


def test_an_interrupt_while_a_stage_imports_is_one_line(tmp_path: Path) -> None:
    """Before ``cli.run`` handles Ctrl-C (the stage module's imports), the stages package's
    hook prints one line instead of the cut-short import's traceback; the process still ends
    by SIGINT, as Python ends an interrupted program."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_AN_IMPORT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "stages.report", "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.stderr == "interrupted while starting: nothing was written\n"
    assert done.returncode == -signal.SIGINT
    # python -X dev keeps the traceback (a stage hanging in an import: where?)
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-m", "stages.report", "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "Traceback" in done.stderr and "KeyboardInterrupt" in done.stderr


def test_the_hook_is_a_stage_processs_only() -> None:
    """A library user importing ``stages`` keeps Python's own excepthook."""
    code = "import sys, stages; print(sys.excepthook is sys.__excepthook__)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "True\n"


def test_sigterm_is_not_swallowed_and_a_second_one_does_not_cut_the_cleanup_short(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM unwinds the stage as Ctrl-C does: code that catches Exception (a failing logger,
    a retrying upload) does not stop it, and the second SIGTERM srun or torchrun send while the
    stage gives its lock back is ignored."""
    cleaned = []

    def stage(argv: object) -> None:
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except Exception:  # what a logger's or an uploader's error handling does
                pytest.fail("SIGTERM was swallowed")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # the second one, during the cleanup
            time.sleep(0.05)
            cleaned.append(True)

    monkeypatch.setattr("sys.argv", ["stage"])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        cli.run(stage)
    assert stop.value.code == 143 and cleaned == [True]
    assert "terminated (SIGTERM): finished outputs are intact" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_interrupted_training_run_is_told_what_its_rerun_does(tmp_path: Path) -> None:
    """The train stage's note: resumes from the last checkpoint, starts afresh without one,
    or (trained, the final rename cut short) only completes the run."""
    from types import SimpleNamespace

    from stages.train import _resumption

    partial = tmp_path / "0123.partial"
    run = SimpleNamespace(run_id="0123", name="simcse.tiny.s1", partial_dir=partial)
    assert _resumption(run).endswith("had no checkpoint yet: a rerun starts it afresh")
    (partial / "checkpoint-3").mkdir(parents=True)
    (partial / "checkpoint-6").mkdir()
    (partial / ".checkpoint-9.tmp").mkdir()  # a temporary: not a checkpoint
    assert _resumption(run) == (
        f"run 0123 (simcse.tiny.s1) stays unfinished in {partial}; a rerun resumes it from "
        "checkpoint-6"
    )
    (partial / "metrics.json").write_text("{}")
    assert _resumption(run) == "run 0123 (simcse.tiny.s1) finished training: a rerun completes it"


def test_commands_quote_a_params_path_for_the_shell() -> None:
    from stages.core.schema.data_check import restore_command
    from stages.core.storage.layout import params_flag

    assert params_flag("params.yaml") == "" and params_flag(None) == ""
    assert params_flag("presets/smoke.yaml") == " --params presets/smoke.yaml"
    assert params_flag("my presets/a b.yaml") == " --params 'my presets/a b.yaml'"
    assert restore_command("wiki1m_head_11913", "my presets/a b.yaml") == (
        "python -m stages.download corpus --params 'my presets/a b.yaml'"
    )


@pytest.mark.parametrize(
    ("stage", "flag", "value", "problem"),
    [
        ("stages.evaluations.senteval", "--max-length", "0", "must be at least 1 (got 0)"),
        ("stages.evaluations.senteval", "--batch-size", "-2", "must be at least 1 (got -2)"),
        ("stages.evaluations.mteb", "--batch-size", "0", "must be at least 1 (got 0)"),
        ("stages.evaluations.sts_tsv", "--max-length", "1e3", "not an integer: '1e3'"),
    ],
)
def test_a_count_or_length_flag_below_one_is_refused_before_any_work(
    stage: str, flag: str, value: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0 read as "unset" once and quietly ran the default; a negative length reached the tokenizer
    main = __import__(stage, fromlist=["main"]).main
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "m", "--output", "out.json", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: {problem}" in capsys.readouterr().err


@pytest.mark.parametrize("buffered", [True, False])
def test_a_reader_that_stops_early_gets_no_traceback(buffered: bool) -> None:
    """``cse estimates | head -1``: the rest of the output is dropped quietly, exit 141 (as a
    command killed by SIGPIPE), whether the output is buffered (a pipe's default) or not. The
    reader here closes before the command writes a line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as closed_pipe:
        done = subprocess.run(
            [sys.executable, "-m", "stages.commands", "estimates", "--params", "params.yaml"],
            cwd=REPO, env=env, stdout=closed_pipe, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    assert (done.returncode, done.stderr) == (141, "")
