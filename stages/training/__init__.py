"""The training stage's machinery: SimCSE-protocol contrastive training of a Hugging Face encoder.

- ``data``: the corpus, tokenised once and cached, served as seeded, resumable, dynamically
  padded batches; the masked-triplet pool of objectives that need it;
- ``model``: the duplicated-batch forward (two dropout views in one pass), pooling, the
  training-only MLP head, the dropout-off triplet forward;
- ``optim``: AdamW, the learning-rate schedule, sharpness-aware minimisation;
- ``distributed``: torchrun data parallelism and negatives gathered across ranks;
- ``runtime``: device, precision and the host-device transfer policy;
- ``records``: the per-step JSONL log, the non-finite check, the progress bar;
- ``resume``: atomic, resumable checkpoints;
- ``dev``: encoding dev sentences with the model being trained;
- ``loop``: the training loop that ties them together.
"""
