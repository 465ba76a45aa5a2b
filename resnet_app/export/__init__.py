"""Export: a run's checkpoint as a SavedModel, TFLite and ONNX files, checked for parity.

`savedmodel.py` writes the SavedModel; `formats.py` registers the other
formats (one module each), which `deploy.py` writes and `parity.py` compares;
`portable.py` is the classifier they hold; `classify.py` is what
`resnet-app predict` runs.
"""
