"""The cross-lingual benchmark: the grid and its presets, runs, metrics and reports (the tasks and
prompts are `polyspec.tasks`)."""
