"""A format written only for a test: the portable classifier as a zipped SavedModel.

It shows what a new export format takes: this module (`convert`, `Runner`) and
one line in `resnet_app/export/formats.py`'s FORMATS.
"""

import io
import os
import shutil
import tempfile
import zipfile

import numpy as np
import tensorflow as tf


def convert(classifier, variant, calibration, info):
    del variant, calibration, info
    with tempfile.TemporaryDirectory() as folder:
        tf.saved_model.save(classifier, folder, signatures={"serving_default": classifier.classify})
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for root, _, files in os.walk(folder):
                for name in files:
                    path = os.path.join(root, name)
                    archive.write(path, os.path.relpath(path, folder))
        return buffer.getvalue()


class Runner:
    def __init__(self, path):
        self._folder = tempfile.mkdtemp()
        with zipfile.ZipFile(path) as archive:
            archive.extractall(self._folder)
        self._signature = tf.saved_model.load(self._folder).signatures["serving_default"]

    def __call__(self, images):
        return self._signature(images=tf.constant(images))["probabilities"].numpy()

    def __del__(self):
        shutil.rmtree(self._folder, ignore_errors=True)


def probabilities(runner, images):
    return np.asarray(runner(images))
