"""Run a stage CLI in this process and SIGKILL it at a chosen point (fault injection).

    python kill_point.py TARGET N WHEN [MATCH] -- MODULE ARGS...

TARGET is ``module:attr`` or ``module:Class.attr``: its N-th call (counting only calls with an
argument whose text contains MATCH, when given) kills the process with SIGKILL just ``before``
or ``after`` the call. A real SIGKILL: no cleanup, no finally blocks, no atexit. With
``KILL_SIGNAL=SIGTERM`` in the environment it sends that signal instead; with
``HOLD_UNTIL=PATH`` it sends none and waits there until PATH exists (a process held at a known
point while a test runs another against it).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def arm(target: str, n: int, when: str, match: str) -> None:
    module_name, attr = target.split(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)
    calls = 0
    kill = getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL"))
    release = os.environ.get("HOLD_UNTIL")

    def stop_here() -> None:
        if release is None:
            os.kill(os.getpid(), kill)
            return
        while not Path(release).exists():
            time.sleep(0.05)

    def counts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if not match:
            return True
        texts = [a for a in (*args, *kwargs.values()) if isinstance(a, str | os.PathLike)]
        return any(match in os.fspath(t) for t in texts)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        hit = False
        if counts(args, kwargs):
            calls += 1
            hit = calls == n
        if hit and when == "before":
            stop_here()
        result = original(*args, **kwargs)
        if hit and when == "after":
            stop_here()
        return result

    setattr(owner, name, wrapper)


def main() -> None:
    sep = sys.argv.index("--")
    target, n, when, *match = sys.argv[1:sep]
    module, *args = sys.argv[sep + 1 :]
    arm(target, int(n), when, match[0] if match else "")
    stage = importlib.import_module(module)
    from stages.core import cli

    sys.argv = [module, *args]
    cli.run(stage.main)


if __name__ == "__main__":
    main()
