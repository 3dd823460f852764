"""The software a result was computed with, read from package metadata (importing no package).

Every run and evaluation records it; with ``identity.environment: major_minor`` in params the
major.minor versions of torch and transformers (which are known to move SimCSE-style results)
also become part of every id, for labs that want results of different stacks kept apart.
"""

from __future__ import annotations

import platform
from functools import cache
from importlib import metadata

PACKAGES = ("torch", "transformers", "mteb", "numpy", "cse-repro")
# The versions that enter ids under ``identity.environment: major_minor``.
PINNED_IN_ID = ("torch", "transformers")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@cache
def software() -> dict[str, str | None]:
    """Python and the versions of the packages that compute results."""
    return {"python": platform.python_version(), **{p: _version(p) for p in PACKAGES}}


def major_minor(version: str | None) -> str | None:
    return ".".join(version.split("+")[0].split(".")[:2]) if version else None


def id_environment(mode: str) -> dict[str, str | None] | None:
    """What of the environment enters ids: nothing ('recorded') or torch/transformers x.y."""
    if mode == "recorded":
        return None
    return {p: major_minor(software()[p]) for p in PINNED_IN_ID}
