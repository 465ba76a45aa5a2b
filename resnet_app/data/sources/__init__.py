"""Where examples come from: one registry of sources, picked by `--dataset=scheme:argument`.

Built in: `shapes` (generated), `folder:PATH`, `csv:FILE`, `tfrecord:DIR`, `idx:DIR`,
`cifar:PATH`, `hf:DIR`, any other name a tfds dataset, and `synthetic` (no source: the
pipeline makes random batches); a plugin module may add a scheme (`registry.py`). Every
failure a user can fix is one line (`ConfigError`). Nothing here imports TensorFlow at
module level, so command-line tools check a `--dataset` before paying for it.
"""

# The source modules register their schemes when imported; the names below are the package's.
# ruff: noqa: F401
from resnet_app.data.sources import (
    cifar,
    folder,
    hugging_face,
    idx,
    shapes_source,
    table,
    tfds_source,
    tfrecord,
)
from resnet_app.data.sources.base import HOLDOUT_SPLIT, Source, Split, eval_batches, hold_out
from resnet_app.data.sources.folder import load as load_folder
from resnet_app.data.sources.registry import load_source, parse, register_source
from resnet_app.data.sources.shapes_source import load_shapes
from resnet_app.data.sources.tfds_source import NETWORK_PROBE_ENV, network_available
