"""Progressive resizing: the training image size as a pure function of the epoch (no TF).

Small images early and full-size ones late train faster for the same accuracy (fast.ai's
DAWNBench ImageNet entry, 128 -> 224 -> 288 px; FFCV's ResNet-50, 160 -> 192 px).
`data.progressive` gives the sizes as a ramp (FFCV's, one size per whole epoch) or a list
(whose epochs may be fractions). A step trains at the size of its first example's epoch,
`step * batch / examples_per_epoch`, so a run resumed at any step, on any number of towers
or workers, trains at the uninterrupted run's sizes, and each example keeps its draws
(seeded by (seed, epoch, id), not by the size). The trainer builds one input stream per
size, entered at the data position, and traces the loop once per size still ahead.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from fractions import Fraction

from resnet_app.common.errors import ConfigError
from resnet_app.data.settings import ProgressiveSettings

SMALL_IMAGES = 64  # Images of at most this size round to multiples of 8, not 32.


def rounding(settings: ProgressiveSettings, final_size: int) -> int:
    """The multiple a ramp's sizes round to: `settings.multiple`, else 32 (8 for small images)."""
    if settings.multiple:
        return settings.multiple
    return 8 if final_size <= SMALL_IMAGES else 32


def size_at_epoch(settings: ProgressiveSettings, epoch: float, final_size: int) -> int:
    """The training size at `epoch`, a real number counted from 0 (the ramp reads whole
    epochs); `final_size` is the run's, the ramp's end by default and the size when off."""
    if settings.sizes:
        return settings.sizes[bisect.bisect_right(settings.epochs, epoch) - 1]
    if settings.start_size is None:
        return final_size
    epoch = math.floor(epoch)  # FFCV's ramp: one size per whole epoch.
    start, end = settings.start_size, settings.end_size or final_size
    if epoch <= settings.start_epoch:
        return start
    if epoch >= settings.end_epoch:
        return end
    share = (epoch - settings.start_epoch) / (settings.end_epoch - settings.start_epoch)
    multiple = rounding(settings, final_size)
    # FFCV's rounding: to the nearest multiple, ties to even (`np.round`).
    return max(multiple, multiple * round((start + share * (end - start)) / multiple))


def _first_step(epoch: Fraction, batch_size: int, examples_per_epoch: int) -> int:
    """The first step whose first example is at `epoch` or later."""
    return math.ceil(epoch * examples_per_epoch / batch_size)


@dataclasses.dataclass(frozen=True)
class SizeSchedule:
    """The training size of every step: the first step of each size (increasing, from 0),
    the size from there on (neighbours differ) and the epoch it starts at."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    epochs: tuple[float, ...]

    def size_at(self, step: int) -> int:
        return self.sizes[bisect.bisect_right(self.starts, step) - 1]

    def next_change(self, step: int) -> int | None:
        """The first step after `step` that trains at another size, or None."""
        index = bisect.bisect_right(self.starts, step)
        return self.starts[index] if index < len(self.starts) else None

    @property
    def progressive(self) -> bool:
        return len(self.sizes) > 1

    @staticmethod
    def of(changes) -> SizeSchedule:
        """From (first step, size, epoch) in step order: where the size changes."""
        starts, sizes, epochs = [], [], []
        for start, size, epoch in changes:
            if not sizes or size != sizes[-1]:
                starts.append(start)
                sizes.append(size)
                epochs.append(epoch)
        return SizeSchedule(tuple(starts), tuple(sizes), tuple(epochs))

    def describe(self) -> str:
        """E.g. "16 px from epoch 0, 24 from epoch 2 (step 48), 32 from epoch 4 (step 97)"."""
        changes = zip(self.starts[1:], self.sizes[1:], self.epochs[1:])
        later = [f"{size} from epoch {epoch:g} (step {start})" for start, size, epoch in changes]
        return ", ".join([f"{self.sizes[0]} px from epoch 0", *later])


def size_schedule(
    settings: ProgressiveSettings,
    final_size: int,
    batch_size: int,
    examples_per_epoch: int,
    total_steps: int,
) -> SizeSchedule:
    """The `SizeSchedule` of a run (one size when resizing is off); refuses a ramp that
    would train at one size throughout."""
    if settings.sizes:
        changes: dict[int, tuple[int, float]] = {}  # Step: (size, epoch); a later one wins.
        for epoch, size in zip(settings.epochs, settings.sizes):
            exact = Fraction(repr(float(epoch)))  # As written: 0.4 is 2/5, not the nearest float.
            start = _first_step(exact, batch_size, examples_per_epoch)
            if start < max(total_steps, 1):
                changes[start] = (size, float(epoch))
        return SizeSchedule.of((start, *change) for start, change in sorted(changes.items()))
    last_epoch = max(0, total_steps - 1) * batch_size // examples_per_epoch  # Of the last step.
    last_change = int(math.ceil(settings.end_epoch or 0))
    schedule = SizeSchedule.of(
        (
            _first_step(Fraction(epoch), batch_size, examples_per_epoch),
            size_at_epoch(settings, epoch, final_size),
            float(epoch),
        )
        for epoch in range(min(last_epoch, last_change) + 1)
    )
    sizes = schedule.sizes
    if settings.start_size is not None and len(sizes) == 1 and sizes[0] != final_size:
        raise ConfigError(
            f"data.progressive: the ramp (FFCV's form) sets one size per whole epoch, so this "
            f"run of {last_epoch + 1} epoch(s) would train at {sizes[0]} px throughout; ramp "
            f"over more epochs, or give data.progressive.sizes and .epochs (fractions allowed)"
        )
    return schedule
