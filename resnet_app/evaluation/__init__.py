"""Evaluation: exact metrics over every example once, and reports on saved checkpoints.

- `exact_eval.py`: top-1/top-5/loss (and mAP for multi-label data) over every
  example exactly once, on any number of towers or workers; training imports it.
- `checkpoint_eval.py`, `reports.py`, `multi_label_report.py`,
  `label_metrics.py`: what `resnet-app evaluate` reports on a checkpoint
  (per-class tables, the confusion matrix).
- `calibration.py`, `temperature.py`, `reliability_plot.py`: ECE, NLL, a fitted
  temperature and the reliability diagram.
- `tta.py`: test-time augmentation (flip, crops).

Nothing here exports a model: `resnet_app/export/` does, and imports this.
"""
