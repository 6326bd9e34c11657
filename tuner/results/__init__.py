"""From raw repeats to scores, speedups and the one best/baseline choice, kept in the study store."""
