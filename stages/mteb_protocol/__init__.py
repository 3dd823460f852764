"""MTEB evaluation with the official ``mteb`` package: task objects (``tasks``; the named task
sets are torch- and mteb-free in ``stages.core.schema.mteb_task_sets``), local copies of the STS
datasets (``local_data``), the encoder wrapper (``model``) and the evaluation loop
(``evaluate``). The stage CLI is ``stages/evaluations/mteb.py``.
"""
