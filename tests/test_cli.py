"""The stage processes' clean failures (stages.cli.run)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from stages import cli
from stages.core.atomic import write_json


def test_a_full_disk_anywhere_is_one_message_and_leaves_nothing_looking_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "experiments" / "a" / "senteval.json"

    def disk_full(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))

    monkeypatch.setattr(Path, "write_text", disk_full)
    monkeypatch.setattr("sys.argv", ["stage"])
    with pytest.raises(SystemExit) as stop:
        cli.run(lambda argv: write_json(dest, {"sts_avg": 80.0}))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: No space left on device writing {dest}. ")
    assert "Traceback" not in err
    assert list(dest.parent.iterdir()) == []  # neither the output nor a temporary


def test_other_os_errors_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(argv: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/root/x")

    monkeypatch.setattr("sys.argv", ["stage"])
    with pytest.raises(PermissionError):
        cli.run(denied)
