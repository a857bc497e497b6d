"""The cross-lingual benchmark: tasks and prompts, runs, metrics and reports."""
