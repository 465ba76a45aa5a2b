"""Where examples come from: one registry of sources, picked by `--dataset=scheme:argument`.

- `shapes`: the built-in generated dataset (`shapes_source.py`);
- `folder:PATH`: an image folder in the ImageNet layout (`folder.py`);
- `csv:FILE`: a table of image paths and labels, CSV, TSV or JSON lines (`table.py`);
- `tfrecord:DIR`: ImageNet-style TFRecord shards (`tfrecord.py`);
- `idx:DIR`: the MNIST family's IDX files (`idx.py`);
- `cifar:PATH`: the CIFAR-10 and CIFAR-100 archives as distributed (`cifar.py`);
- any other name: a tfds dataset (`tfds_source.py`);
- `synthetic`: no source; the pipeline makes random batches;
- a scheme of the user's own: a plugin module (`registry.py`, docs/data.md).

Every source gives class names and `Split`s (`base.py`), read by index or
streamed. Every failure a user can fix raises `ConfigError` with one line that
says what to do. Nothing here imports TensorFlow at module level, so that
command-line tools can check a `--dataset` before paying for the import.
"""

from resnet_app.data.sources import (
    cifar,
    folder,
    idx,
    shapes_source,
    table,
    tfds_source,
    tfrecord,
)
from resnet_app.data.sources.base import (
    EVAL_SPLITS,
    HOLDOUT_SEED,
    HOLDOUT_SPLIT,
    RecordStream,
    Source,
    Split,
    eval_batches,
    hold_out,
)
from resnet_app.data.sources.folder import load as load_folder
from resnet_app.data.sources.image_files import sniff_image
from resnet_app.data.sources.registry import file_label, load_source, parse, register_source
from resnet_app.data.sources.shapes_source import load_shapes
from resnet_app.data.sources.tfds_source import (
    NETWORK_PROBE_ENV,
    load_tfds,
    network_available,
    tfds_data_dir,
)

__all__ = [
    "EVAL_SPLITS",
    "HOLDOUT_SEED",
    "HOLDOUT_SPLIT",
    "NETWORK_PROBE_ENV",
    "RecordStream",
    "Source",
    "Split",
    "cifar",
    "eval_batches",
    "file_label",
    "folder",
    "hold_out",
    "idx",
    "load_folder",
    "load_shapes",
    "load_source",
    "load_tfds",
    "network_available",
    "parse",
    "register_source",
    "shapes_source",
    "sniff_image",
    "table",
    "tfds_data_dir",
    "tfds_source",
    "tfrecord",
]
