"""`shapes`: the built-in offline dataset of geometric shapes.

32x32 RGB images in 10 classes, 50,000 for training and 10,000 for testing like CIFAR-10,
generated with NumPy so that a fresh machine with no network can train something real:
one shape of random colour, size, position and rotation, anti-aliased over a colour
gradient with distractor strokes and dots, plus pixel noise. Image i of a split depends
only on (seed, split, i): images are drawn in fixed chunks from
`np.random.default_rng([seed, split, chunk])`, so a prefix is the same whatever the total.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os

import numpy as np

from resnet_app.common import files

CLASS_NAMES = (
    *("circle", "ring", "triangle", "square", "hexagon"),
    *("star", "cross", "crescent", "heart", "semicircle"),
)
SPLIT_SIZES = {"train": 50_000, "test": 10_000}
IMAGE_SIZE = 32
CACHE_VERSION = 1  # Bumped whenever the drawing changes, so old caches are not reused.

_SPLIT_IDS = {"train": 0, "test": 1}
_CHUNK = 1000
_SUPERSAMPLE = 2  # Shapes are drawn at 64x64 and averaged down: anti-aliasing.


def _polygon(rho: np.ndarray, phi: np.ndarray, sides: int) -> np.ndarray:
    # Inside a regular polygon with vertices at radius 1, one at phi = 0.
    sector = 2 * math.pi / sides
    local = np.mod(phi, sector) - sector / 2
    return rho * np.cos(local) <= math.cos(math.pi / sides)


def _star(rho: np.ndarray, phi: np.ndarray, points: int = 5, inner: float = 0.45) -> np.ndarray:
    # Fold the angle into [0, pi/points]: the edge there runs from the outer
    # vertex (1, 0) to the inner vertex at angle pi/points.
    half = math.pi / points
    folded = np.abs(np.mod(phi, 2 * half) - half)
    folded = half - folded
    x, y = rho * np.cos(folded), rho * np.sin(folded)
    ix, iy = inner * math.cos(half), inner * math.sin(half)
    # Sign of the cross product (I - O) x (P - O); the origin is on the inside side.
    return (ix - 1) * y - iy * (x - 1) <= 0


def _shape_mask(label: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Inside-test of class `label` in unit coordinates (radius about 1)."""
    rho = np.hypot(a, b)
    phi = np.arctan2(b, a)
    name = CLASS_NAMES[label]
    if name == "circle":
        return rho <= 0.9
    if name == "ring":
        return (rho <= 1.0) & (rho >= 0.6)
    sides = {"triangle": 3, "square": 4, "hexagon": 6}
    if name in sides:
        return _polygon(rho, phi, sides[name])
    if name == "star":
        return _star(rho, phi)
    if name == "cross":
        arm = 0.3
        return ((np.abs(a) <= arm) & (np.abs(b) <= 1)) | ((np.abs(b) <= arm) & (np.abs(a) <= 1))
    if name == "crescent":
        return (rho <= 1.0) & (np.hypot(a - 0.5, b) > 0.8)
    if name == "heart":
        x, y = a * 1.15, b * 1.15 + 0.15
        return (x * x + y * y - 1) ** 3 - x * x * y**3 <= 0
    # semicircle: the flat side through the origin, shifted to centre the area.
    b = b + 0.42
    return (np.hypot(a, b) <= 1.0) & (b >= 0)


def _grid(resolution: int) -> tuple[np.ndarray, np.ndarray]:
    # Pixel-centre coordinates in units of the 32x32 output, shaped [1, res, res].
    coords = (np.arange(resolution, dtype=np.float32) + 0.5) * (IMAGE_SIZE / resolution)
    grid_y, grid_x = np.meshgrid(coords, coords, indexing="ij")
    return grid_x[None], grid_y[None]


def _generate_chunk(
    rng: np.random.Generator, count: int, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    # Vectorized over the chunk: background and clutter at 32x32, the shape's coverage at
    # 64x64 averaged down, then blended. Every random draw is made for all `count` images,
    # so the first `keep` (the only ones drawn) do not depend on `keep`.
    size = IMAGE_SIZE
    grid_x, grid_y = _grid(size)

    def column(values: np.ndarray) -> np.ndarray:  # [count] -> [keep, 1, 1]
        return values[:keep].astype(np.float32)[:, None, None]

    def rows(values: np.ndarray) -> np.ndarray:  # [count, 3] -> [keep, 1, 1, 3]
        return values[:keep, None, None]

    labels = rng.integers(0, len(CLASS_NAMES), size=count)

    # Background: a linear gradient between two random colours.
    start = rng.uniform(0, 1, (count, 3)).astype(np.float32)
    end = rng.uniform(0, 1, (count, 3)).astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi, count)
    ramp = column(np.cos(angle)) * grid_x + column(np.sin(angle)) * grid_y
    ramp = np.clip(ramp / (size * math.sqrt(2)) + 0.5, 0, 1)[..., None]
    canvas = rows(start) + rows(end - start) * ramp

    # Clutter: 3 to 6 short strokes and dots in random colours.
    clutter = rng.integers(3, 7, count)
    for k in range(6):
        colour = rng.uniform(0, 1, (count, 3)).astype(np.float32)
        cx, cy = (column(v) for v in rng.uniform(0, size, (2, count)))
        is_stroke = rng.random(count) < 0.5
        length, theta = column(rng.uniform(3, 8, count)), rng.uniform(0, math.pi, count)
        width, dot_radius = rng.uniform(0.5, 1.0, count), rng.uniform(0.8, 2.0, count)
        dx, dy = column(np.cos(theta)), column(np.sin(theta))
        # A dot is a stroke of length zero.
        length = np.where(column(is_stroke) > 0, length, 0)
        reach = column(np.where(is_stroke, width, dot_radius))
        along = np.clip((grid_x - cx) * dx + (grid_y - cy) * dy, -length / 2, length / 2)
        mask = np.hypot(grid_x - cx - along * dx, grid_y - cy - along * dy) <= reach
        mask &= (k < clutter[:keep])[:, None, None]
        canvas = np.where(mask[..., None], rows(colour), canvas)

    # The shape: its colour is kept 0.3-0.7 away from the background, per channel.
    fine_x, fine_y = _grid(size * _SUPERSAMPLE)
    radius = rng.uniform(6.5, 13, count)
    cx = column(rng.uniform(radius * 0.8, size - radius * 0.8))
    cy = column(rng.uniform(radius * 0.8, size - radius * 0.8))
    theta = rng.uniform(0, 2 * math.pi, count)
    cos, sin, radius = column(np.cos(theta)), column(np.sin(theta)), column(radius)
    a = ((fine_x - cx) * cos + (fine_y - cy) * sin) / radius
    b = (-(fine_x - cx) * sin + (fine_y - cy) * cos) / radius
    colour = np.mod((start + end) / 2 + 0.5 + rng.uniform(-0.2, 0.2, (count, 3)), 1.0)
    inside = np.zeros(a.shape, np.float32)
    for label in range(len(CLASS_NAMES)):
        members = labels[:keep] == label
        inside[members] = _shape_mask(label, a[members], b[members])
    cover = inside.reshape(keep, size, _SUPERSAMPLE, size, _SUPERSAMPLE).mean(axis=(2, 4))
    cover = cover[..., None]
    canvas = canvas * (1 - cover) + rows(colour).astype(np.float32) * cover

    noise = rng.normal(0, 1, (count, size, size, 3))[:keep]
    noise = noise * column(rng.uniform(0.02, 0.08, count))[..., None]
    images = np.clip(np.round((canvas + noise) * 255), 0, 255).astype(np.uint8)
    return images, labels[:keep].astype(np.int64)


def generate(split: str, count: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [count, 32, 32, 3] images, int64 labels): the first `count` of a split
    ("train" or "test"; default: all of it) drawn with the dataset's `seed`."""
    count = SPLIT_SIZES[split] if count is None else count
    if count == 0:
        return np.zeros((0, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8), np.zeros((0,), np.int64)

    def draw(chunk: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, _SPLIT_IDS[split], chunk])
        return _generate_chunk(rng, _CHUNK, keep=min(_CHUNK, count - chunk * _CHUNK))

    # Chunks are independent, and NumPy releases the GIL in its array loops.
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        chunks = list(pool.map(draw, range(math.ceil(count / _CHUNK))))
    images, labels = zip(*chunks)
    return np.concatenate(images)[:count], np.concatenate(labels)[:count]


def default_cache_dir() -> str:
    """Where generated splits are kept: $XDG_CACHE_HOME or ~/.cache, /resnet_app."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "resnet_app")


def load(
    split: str, count: int | None = None, seed: int = 0, cache_dir: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`generate`'s images, kept in an .npz file in `cache_dir` (default:
    `default_cache_dir()`) between runs; a damaged one is drawn again (one warning line)."""
    count = SPLIT_SIZES[split] if count is None else count
    cache_dir = cache_dir or default_cache_dir()
    path = os.path.join(cache_dir, f"shapes-v{CACHE_VERSION}-seed{seed}-{split}-{count}.npz")
    cached = files.read_cache(path, lambda npz: (npz["images"], npz["labels"]))
    if cached is not None:
        return cached
    images, labels = generate(split, count, seed)  # Missing or damaged: draw it again.
    with contextlib.suppress(OSError):  # A read-only home is fine: drawn again next time.
        write_cache(path, images=images, labels=labels)
    return images, labels


def write_cache(path: str, **arrays) -> None:
    """Writes `arrays` to the .npz file `path` atomically (a temporary file, then a rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def write(temporary: str) -> None:
        with open(temporary, "wb") as file:  # A file: np.savez would add ".npz" to a name.
            np.savez(file, **arrays)

    files.write_atomically(path, write)
