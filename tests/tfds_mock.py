"""tfds datasets for tests: `tfds.testing.mock_data` with real split metadata.

`mock_data` generates random examples through tfds's own builder and
`as_dataset` code, but on its own it reports no splits. Writing the dataset
info that a prepared dataset would have (split names and sizes) lets the code
under test take its normal path: builder, `is_prepared`, info, `as_dataset`.
"""

import contextlib
import socket

import tensorflow_datasets as tfds


def write_metadata(name: str, data_dir: str, sizes: dict[str, int]) -> None:
    builder = tfds.builder(name, data_dir=data_dir)
    template = tfds.core.ShardedFileTemplate(
        data_dir=builder.data_path,
        template="{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}",
        dataset_name=builder.name,
        filetype_suffix="tfrecord",
    )
    splits = [
        tfds.core.SplitInfo(
            name=split,
            shard_lengths=[count],
            num_bytes=0,
            filename_template=template.replace(split=split),
        )
        for split, count in sizes.items()
    ]
    builder.info.set_splits(tfds.core.SplitDict(splits))
    builder.data_path.mkdir(parents=True, exist_ok=True)
    builder.info.write_to_directory(builder.data_path)


@contextlib.contextmanager
def mock_tfds(name: str, data_dir: str, splits: tuple[str, ...], num_examples: int):
    """Every split of `name` holds `num_examples` random examples."""
    write_metadata(name, data_dir, dict.fromkeys(splits, num_examples))
    with tfds.testing.mock_data(
        num_examples=num_examples,
        policy=tfds.testing.MockPolicy.USE_FILES,
        data_dir=data_dir,
    ):
        yield


def closed_port() -> str:
    """host:port of a local port nobody listens on: a network probe there fails at once."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"127.0.0.1:{port}"
