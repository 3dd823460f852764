"""The SentEval evaluation protocol (STS and transfer tasks), re-implemented to give SentEval's
numbers (as SimCSE's evaluation.py runs it) with batched classifiers and cached embeddings.

``evaluate.evaluate(encode, tasks, data_dir, mode)`` scores any ``encode(list[str]) -> array``;
``dev.StsbDevEvaluation`` is the STS-B dev score used for checkpoint selection during training.
Nothing is imported here, so importing one module does not pull in the others (and a run's code
identity, which follows imports, covers only what checkpoint selection uses).
"""
