"""What params.yaml may say: the sections, objectives, evaluations and data manifest."""
