"""Where and how things are kept: paths, atomic writes, locks, hashes, the runs store."""
