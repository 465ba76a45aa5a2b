"""How far each exported file is from the trained model: the export's parity report.

Every format runs on the same uint8 images of the run's evaluation split
(`portable.split_images`) and is compared with the SavedModel beside it:
`top1` (multi-label: the top class is one of the image's), `agreement` (the
same top-1 class as the SavedModel), `max_prob_diff`, `size_bytes` and
`latency_ms` (the median of `LATENCY_RUNS` single-image calls after a warm-up).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

LATENCY_RUNS = 20
CHUNK = 256


def predict_all(run: Callable[[np.ndarray], np.ndarray], images: np.ndarray) -> np.ndarray:
    """Probabilities of all `images`, in chunks."""
    if not len(images):
        return np.zeros((0, 0), np.float32)
    return np.concatenate([run(images[i : i + CHUNK]) for i in range(0, len(images), CHUNK)])


def latency_ms(run: Callable[[np.ndarray], np.ndarray], image: np.ndarray) -> float:
    """The median time of a single-image call, in milliseconds."""
    run(image[None])
    times = []
    for _ in range(LATENCY_RUNS):
        started = time.perf_counter()
        run(image[None])
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1000)


def path_size(path: str) -> int:
    """Bytes of a file, or of every file under a directory."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


def measure(
    name: str,
    path: str,
    run: Callable[[np.ndarray], np.ndarray],
    images: np.ndarray,
    labels: np.ndarray,
    reference: np.ndarray | None,
) -> tuple[dict, np.ndarray]:
    """One format's row of the report (see the module docstring), and its probabilities."""
    probabilities = predict_all(run, images)
    row = {"format": name, "file": os.path.basename(path), "size_bytes": path_size(path)}
    if len(images):
        predicted = probabilities.argmax(axis=1)
        if labels.ndim == 2:  # Multi-label: the top class is one of the image's.
            row["top1"] = float(np.mean(labels[np.arange(len(labels)), predicted] > 0))
        else:
            row["top1"] = float(np.mean(predicted == labels))
        if reference is not None:
            row["agreement"] = float(np.mean(predicted == reference.argmax(axis=1)))
            row["max_prob_diff"] = float(np.abs(probabilities - reference).max())
        row["latency_ms"] = latency_ms(run, images[0])
    return row, probabilities


def table_lines(rows: list[dict]) -> list[str]:
    """The report as a table: one line per format."""

    def cell(row: dict, key: str, spec: str) -> str:
        width = int(spec.split(".")[0])
        return format(row[key], spec) if key in row else "-".rjust(width)

    header = (
        f"{'format':<18} {'top-1':>7} {'agree':>7} {'max |dp|':>9} {'size MB':>8} {'ms/img':>7}"
    )
    return [header] + [
        f"{row['format']:<18} {cell(row, 'top1', '7.2%')} {cell(row, 'agreement', '7.2%')} "
        f"{cell(row, 'max_prob_diff', '9.1e')} {row['size_bytes'] / 1e6:8.2f} "
        f"{cell(row, 'latency_ms', '7.2f')}"
        for row in rows
    ]
