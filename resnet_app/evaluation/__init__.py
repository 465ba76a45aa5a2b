"""Evaluation of saved checkpoints: what `resnet-app evaluate` and `average` report and write.

`checkpoint_eval.py` evaluates checkpoints (the exact evaluation itself is
`engine/exact_eval.py`), `reports.py` writes their reports, `watch.py`
follows a training run; `calibration.py`, `temperature.py` and
`reliability_plot.py` measure and fix calibration; `soup.py` averages
checkpoints. Nothing here exports a model.
"""
