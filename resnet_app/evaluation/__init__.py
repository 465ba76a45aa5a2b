"""Evaluation: exact metrics over every example once, and reports on saved checkpoints.

The exact evaluation itself (`engine/exact_eval.py`, `tta.py`, `label_metrics.py`)
sits below, in the engine, which evaluates while it trains.
- `checkpoint_eval.py`, `reports.py`, `multi_label_report.py`: what
  `resnet-app evaluate` reports on a checkpoint (per-class tables, the confusion matrix).
- `calibration.py`, `temperature.py`, `reliability_plot.py`: ECE, NLL, a fitted
  temperature and the reliability diagram.

Nothing here exports a model: `resnet_app/export/` does, and imports this.
"""
