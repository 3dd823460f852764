"""Commands: the pipeline's status, DVC file, dry run, runs store, export."""
