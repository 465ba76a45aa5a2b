"""Users' own data for tests: TFRecord shards (build_imagenet_data.py's layout), tables, IDX."""

import csv
import gzip
import os

import numpy as np
import tensorflow as tf

from resnet_app.data import shapes


def example(
    image_bytes, label, text=None, image_key="image/encoded", label_key="image/class/label"
):
    features = {
        image_key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_bytes])),
        label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    if text is not None:
        features["image/class/text"] = tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[text.encode()])
        )
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def write_shards(root, split, images, labels, sizes, offset=1, texts=True, **keys):
    """`root/split-0000i-of-0000n`, `sizes[i]` records each: PNGs, labels + offset.

    Returns:
      The shard paths.
    """
    assert sum(sizes) == len(labels)
    os.makedirs(root, exist_ok=True)
    paths, start = [], 0
    for i, size in enumerate(sizes):
        path = os.path.join(root, f"{split}-{i:05d}-of-{len(sizes):05d}")
        with tf.io.TFRecordWriter(path) as writer:
            for j in range(start, start + size):
                text = shapes.CLASS_NAMES[labels[j]] if texts else None
                png = tf.io.encode_png(images[j]).numpy()
                writer.write(example(png, labels[j] + offset, text, **keys))
        paths.append(path)
        start += size
    return paths


def shapes_shards(root, train_sizes=(13, 9, 16, 11, 7, 14, 10), eval_sizes=(12, 13), **kwargs):
    """`shapes` images as train-* and validation-* shards (1-based labels, class texts)."""
    images, labels = shapes.generate("train", sum(train_sizes) + sum(eval_sizes), seed=5)
    count = sum(train_sizes)
    write_shards(root, "train", images[:count], labels[:count], train_sizes, **kwargs)
    write_shards(root, "validation", images[count:], labels[count:], eval_sizes, **kwargs)
    return images, labels


def plain_read(paths, offset=1):
    """(PNG bytes, labels) of every record of `paths`, in order: a plain tf.data read."""
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }
    images, labels = [], []
    for record in tf.data.TFRecordDataset(list(paths)):
        features = tf.io.parse_single_example(record, spec)
        images.append(features["image/encoded"].numpy())
        labels.append(int(features["image/class/label"]) - offset)
    return images, np.array(labels, np.int64)


def write_table(path, rows, columns=("path", "label", "split")):
    """A CSV (or TSV, by the extension) of `rows`, tuples in `columns` order."""
    delimiter = "\t" if str(path).endswith(".tsv") else ","
    with open(path, "w", newline="") as file:
        writer = csv.writer(file, delimiter=delimiter)
        writer.writerow(columns)
        writer.writerows(rows)


def write_pngs(root, images, prefix="img"):
    """Each image as `root/<prefix><i>.png`; returns the names, relative to root."""
    os.makedirs(root, exist_ok=True)
    names = []
    for i, image in enumerate(images):
        name = f"{prefix}{i:04d}.png"
        tf.io.write_file(os.path.join(root, name), tf.io.encode_png(image))
        names.append(name)
    return names


IDX_NAMES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


def idx_bytes(array):
    """An IDX file's bytes: magic (0, 0, 0x08, rank), big-endian int32 sizes, the bytes."""
    header = bytes([0, 0, 8, array.ndim]) + np.array(array.shape, ">i4").tobytes()
    return header + np.ascontiguousarray(array, np.uint8).tobytes()


def write_idx(directory, arrays, gzipped=True, prefix=""):
    """{(split, "images" or "labels"): uint8 array} as MNIST's four files in `directory`."""
    os.makedirs(directory, exist_ok=True)
    for role, array in arrays.items():
        path = os.path.join(directory, prefix + IDX_NAMES[role])
        data = idx_bytes(array)
        with gzip.open(f"{path}.gz", "wb") if gzipped else open(path, "wb") as file:
            file.write(data)


def write_hf(root, splits, names, layout="hub", shards=1, rows_per_group=None):
    """A Hugging Face dataset written by the `datasets` library: {split: (images, labels)}
    with an Image and a ClassLabel column ("label"), or for label lists a list of them
    ("labels"). `layout`: "hub" (data/{split}-0000i-of-n.parquet, `shards` of the train
    split), "readme" (the same, its features only in a README's YAML) or "disk"
    (DatasetDict.save_to_disk). Returns the `datasets.DatasetDict` written."""
    import datasets
    import huggingface_hub
    import pyarrow.parquet as pq
    from datasets.info import DatasetInfosDict

    label = datasets.ClassLabel(names=list(names))
    multi = isinstance(next(iter(splits.values()))[1][0], list)
    column = "labels" if multi else "label"
    features = datasets.Features(
        {"image": datasets.Image(), column: datasets.List(label) if multi else label}
    )
    written = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {"image": list(images), column: [x if multi else int(x) for x in labels]},
                features=features,
            )
            for split, (images, labels) in splits.items()
        }
    )
    if layout == "disk":
        written.save_to_disk(str(root))
        return written
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    for split, data in written.items():
        count = shards if split == "train" else 1
        for i in range(count):
            path = os.path.join(root, "data", f"{split}-{i:05d}-of-{count:05d}.parquet")
            data.shard(count, i, contiguous=True).to_parquet(path, batch_size=rows_per_group)
            if layout == "readme":  # As other writers (pandas, Spark) leave them.
                pq.write_table(pq.read_table(path).replace_schema_metadata(None), path)
    if layout == "readme":
        card = huggingface_hub.DatasetCardData()
        DatasetInfosDict({"default": written["train"].info}).to_dataset_card_data(card)
        with open(os.path.join(root, "README.md"), "w") as file:
            file.write(f"---\n{card.to_yaml()}\n---\n# A dataset\n")
    return written
