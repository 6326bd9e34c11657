"""The study file, its prompts and search space, and the checks run before any engine starts."""
