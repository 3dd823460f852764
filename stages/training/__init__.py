"""The training stage's machinery: SimCSE-protocol contrastive training of a Hugging Face encoder.

- ``run_folder``: from a planned run to its finished folder in the runs store;
- ``loop``: the training loop on one page (``train``) and one update (``Training.train_step``);
- ``job``: what a run is given; ``parts``: what it is built from (corpus, batch plan, encoder,
  optimizer, schedule, dev encoder);
- ``data``: the corpus, tokenised once and cached, served as seeded, resumable, dynamically
  padded batches; the masked-triplet pool of objectives that need it; ``batch``: a step's rows
  on the device;
- ``contrastive_model``: the duplicated-batch forward (two dropout views in one pass), pooling,
  the training-only MLP head, the dropout-off triplet forward; ``loss``: forward and objective;
- ``optim``: AdamW, the learning-rate schedule, sharpness-aware minimisation, clipping;
- ``distributed``: torchrun data parallelism and negatives gathered across ranks;
- ``runtime``: device, precision, the host-device transfer policy, the profiler's step phases;
- ``records``: the per-step records, the non-finite stop, the JSONL log; ``live``: live loggers;
- ``checkpoints``: atomic, resumable checkpoint folders, saved and restored (fresh start or
  resume); ``progress``: the evaluations and the best weights so far;
- ``dev_encoder``: encoding dev sentences with the model being trained;
- ``outputs``: metrics.json and the final/ and best/ model folders.
"""
