"""Small CIFAR archives for tests, in the four distributed formats, written byte by byte.

Real file names and layouts, few records: CIFAR-10's five training batches,
test batch and meta file, CIFAR-100's train, test and meta files; each as an
extracted directory or a tarball (`cifar-10-binary.tar.gz`, ...). The python
formats are written as Python 2 wrote them (`py2_pickle`: byte strings,
`numpy.core.multiarray._reconstruct`), or by this Python with protocol 2.
"""

import io
import os
import pickle
import struct
import tarfile

import numpy as np

CIFAR10_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR100_FINE = tuple(f"fine{i:02d}" for i in range(100))
CIFAR100_COARSE = tuple(f"coarse{i:02d}" for i in range(20))
# Per format: (directory, tarball).
NAMES = {
    ("cifar10", "binary"): ("cifar-10-batches-bin", "cifar-10-binary.tar.gz"),
    ("cifar10", "python"): ("cifar-10-batches-py", "cifar-10-python.tar.gz"),
    ("cifar100", "binary"): ("cifar-100-binary", "cifar-100-binary.tar.gz"),
    ("cifar100", "python"): ("cifar-100-python", "cifar-100-python.tar.gz"),
}
# Records per training file (CIFAR-10's five batches; CIFAR-100's one) and in the test file.
TRAIN_SIZES = {"cifar10": (7, 5, 3, 4, 2), "cifar100": (13,)}
TEST_SIZE = 11


def _py2_bytes(value: bytes) -> bytes:
    if len(value) < 256:
        return b"U" + bytes([len(value)]) + value  # SHORT_BINSTRING
    return b"T" + struct.pack("<i", len(value)) + value  # BINSTRING


def _py2_value(value) -> bytes:
    if isinstance(value, bytes):
        return _py2_bytes(value)
    if isinstance(value, int):
        return b"K" + bytes([value]) if 0 <= value < 256 else b"J" + struct.pack("<i", value)
    if isinstance(value, list):
        items = b"".join(_py2_value(item) for item in value)
        return b"]" + (b"(" + items + b"e" if value else b"")  # EMPTY_LIST, MARK, APPENDS
    if isinstance(value, np.ndarray):  # A uint8 matrix, as NumPy 1 on Python 2 pickled it.
        assert value.dtype == np.uint8 and value.ndim == 2
        dtype = (
            b"cnumpy\ndtype\n" + _py2_bytes(b"u1") + b"K\x00K\x01\x87R"
            b"(K\x03" + _py2_bytes(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
        )
        shape = _py2_value(value.shape[0]) + _py2_value(value.shape[1]) + b"\x86"
        return (
            b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
            b"K\x00\x85" + _py2_bytes(b"b") + b"\x87R"
            b"(K\x01" + shape + dtype + b"\x89" + _py2_bytes(value.tobytes()) + b"tb"
        )
    raise TypeError(type(value))


def py2_pickle(record: dict) -> bytes:
    """`record` ({bytes: bytes, int, list or uint8 matrix}) as Python 2's cPickle wrote it."""
    items = b"".join(_py2_value(key) + _py2_value(value) for key, value in record.items())
    return b"\x80\x02}(" + items + b"u."


def _pickle(record: dict, python2: bool) -> bytes:
    return py2_pickle(record) if python2 else pickle.dumps(record, protocol=2)


def make_arrays(dataset: str, seed: int = 0) -> dict:
    """{"train"/"test": (uint8 [N, 3072] rows, fine labels, coarse labels)}; train in parts."""
    rng = np.random.default_rng(seed)
    classes = 10 if dataset == "cifar10" else 100
    arrays = {}
    for split, sizes in (("train", TRAIN_SIZES[dataset]), ("test", (TEST_SIZE,))):
        arrays[split] = [
            (
                rng.integers(0, 256, (size, 3072), dtype=np.uint8),
                rng.integers(0, classes, size),
                rng.integers(0, 20, size),
            )
            for size in sizes
        ]
    return arrays


def file_contents(dataset: str, kind: str, arrays: dict, python2: bool = True) -> dict:
    """{file name: bytes} of an archive holding `arrays` (make_arrays's)."""
    files = {}
    if dataset == "cifar10":
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    else:
        names = ["train", "test"]
    parts = [*arrays["train"], *arrays["test"]]
    for name, (rows, fine, coarse) in zip(names, parts, strict=True):
        if kind == "binary":
            labels = [fine[:, None]] if dataset == "cifar10" else [coarse[:, None], fine[:, None]]
            files[name + ".bin"] = np.hstack([*labels, rows]).astype(np.uint8).tobytes()
        elif dataset == "cifar10":
            record = {b"batch_label": name.encode(), b"labels": fine.tolist(), b"data": rows}
            files[name] = _pickle(record, python2)
        else:
            record = {
                b"filenames": [b"x.png"] * len(rows),
                b"fine_labels": fine.tolist(),
                b"coarse_labels": coarse.tolist(),
                b"data": rows,
            }
            files[name] = _pickle(record, python2)
    if dataset == "cifar10" and kind == "binary":
        files["batches.meta.txt"] = ("\n".join(CIFAR10_NAMES) + "\n\n").encode()
    elif dataset == "cifar10":
        meta = {b"label_names": [n.encode() for n in CIFAR10_NAMES], b"num_vis": 3072}
        files["batches.meta"] = _pickle(meta, python2)
    elif kind == "binary":
        files["fine_label_names.txt"] = "\n".join(CIFAR100_FINE).encode()
        files["coarse_label_names.txt"] = "\n".join(CIFAR100_COARSE).encode()
    else:
        meta = {
            b"fine_label_names": [n.encode() for n in CIFAR100_FINE],
            b"coarse_label_names": [n.encode() for n in CIFAR100_COARSE],
        }
        files["meta"] = _pickle(meta, python2)
    return files


def write_archive(root, dataset, kind, arrays=None, tarball=False, python2=True, extra=None):
    """Writes an archive under `root` by its distributed name; returns its path.

    Args:
      root: the directory to write in.
      dataset: "cifar10" or "cifar100".
      kind: "binary" or "python".
      arrays: make_arrays's (default: seed 0's).
      tarball: the .tar.gz as downloaded (else its extracted directory).
      python2: pickles as Python 2 wrote them (else this Python's protocol 2).
      extra: {file name: bytes} to add or replace.
    """
    files = file_contents(dataset, kind, arrays or make_arrays(dataset), python2)
    files.update(extra or {})
    directory, tar_name = NAMES[(dataset, kind)]
    os.makedirs(root, exist_ok=True)
    if not tarball:
        os.makedirs(os.path.join(root, directory), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(root, directory, name), "wb") as file:
                file.write(data)
        return os.path.join(root, directory)
    path = os.path.join(root, tar_name)
    with tarfile.open(path, "w:gz") as tar:
        folder = tarfile.TarInfo(directory)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{directory}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def expected(dataset: str, arrays: dict, split: str, coarse: bool = False):
    """(uint8 [N, 32, 32, 3] images, int64 labels) of a split, read another way: pixel by pixel."""
    rows = np.concatenate([part[0] for part in arrays[split]])
    labels = np.concatenate([part[2 if coarse else 1] for part in arrays[split]])
    images = np.zeros((len(rows), 32, 32, 3), np.uint8)
    for channel in range(3):  # Each row: 1024 red, then 1024 green, then 1024 blue bytes.
        images[..., channel] = rows[:, channel * 1024 : (channel + 1) * 1024].reshape(-1, 32, 32)
    return images, labels.astype(np.int64)
