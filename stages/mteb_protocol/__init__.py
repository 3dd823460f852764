"""MTEB evaluation with the official ``mteb`` package: task sets (``task_sets``), local copies of
the STS datasets (``local_data``), the encoder wrapper (``model``) and the evaluation loop
(``evaluate``). The stage CLI is ``stages/evaluate_mteb.py``.

Nothing is imported here: params.yaml validation imports ``task_sets`` and must not pay for
importing mteb (seconds).
"""
