"""What the workspace should hold and what it holds: the job graph, estimates, status."""
