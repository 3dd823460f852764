"""What determines an output: its code, its environment, and the ids of runs and evaluations."""
