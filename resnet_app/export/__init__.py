"""Export: a run's checkpoint as a SavedModel, TFLite and ONNX files, checked for parity.

- `savedmodel.py`: the SavedModel with its three signatures and class names.
- `formats.py`: the registry of the other formats, {name: Format}; one module
  per format (`tflite.py`, `onnx_export.py`) converts and runs its files.
- `deploy.py`: writes the requested formats into the staged export;
  `parity.py` compares each with the SavedModel; `portable.py` is the
  fixed-size classifier the portable files hold.
- `classify.py`: what `resnet-app predict` runs: an export, any registered
  format's file, or a run's checkpoint.
- `__main__.py`: `python -m resnet_app.export` (`resnet-app export`).
"""
