"""The torch-free core: params schema, identities, paths, the job graph, estimates and errors.

Imports no torch, transformers, datasets or mteb (tests/test_architecture.py), so planning, the
DAG of both orchestrators, ``status``, ``estimates`` and no-op reruns are instant. Everything
else (the objectives, training, modeling, the evaluation protocols, reporting) sits above it and
the stage entry modules (``stages/<stage>.py``) above those; no import points back up.
"""
