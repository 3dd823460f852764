"""Encoders: loading backbones, pooling token states into sentence vectors, checkpoints."""
