"""ArcCSE's masked triplets: the masking and the file they are kept in."""
