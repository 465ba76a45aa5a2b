"""`resnet-app sweep`: searching training settings with Optuna, each trial a training run.

Modules:
- `space`: the searched keys and their ranges or choices (no Optuna, no TensorFlow).
- `study`: the Optuna study: its database, samplers, pruners, and what it searches.
- `trial_run`: one trial as a `resnet-app train` process, and its evaluations as they come.
- `runner`: the checks before any trial, and the loop that runs, prunes and resumes trials.
- `report`: the ranking (`summary.csv`), `sweep.png` and the best recipe (`best.yaml`).
"""
