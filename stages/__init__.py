"""Pipeline stages (one module each, runnable as ``python -m stages.<name>``) and their
building blocks (sub-packages named for what they are)."""

from stages.core import process

process.prepare()
