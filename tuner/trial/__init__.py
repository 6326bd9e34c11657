"""One trial after another: the Optuna loop, pruning, confirmation, workers sharing a study."""
