"""Training objectives of the five papers, as pure functions of two embedding views."""
