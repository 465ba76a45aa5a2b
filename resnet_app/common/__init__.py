"""Shared plumbing below every layer: errors, files, the run directory, checkpoints, towers."""
