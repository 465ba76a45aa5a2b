"""One training example's draws for the optional augmentations, and the op policies.

RandAugment, TrivialAugment, AutoAugment or AugMix (`data.augment.auto_augment`),
random erasing and Cutout each draw from a seed of their own, folded from the
example's (`data/seeds.py`), so the crop and flip draws do not depend on them,
nor the ops drawn on whether some are skipped or their magnitudes drawn. The
draws travel with the example through the pipeline (`AUGMENT_FEATURES`), and
`preprocessing.py` applies them to whole batches.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from resnet_app.data import augmix, autoaugment, randaugment, randaugment_magnitudes, trivialaugment

Preprocessing = Any  # `preprocessing.Preprocessing`, which imports this module.

# The per-example draws of the op policy, random erasing and Cutout (`augment_choices`).
AUGMENT_FEATURES = (
    "op_indices",
    "op_signs",
    "op_magnitudes",
    "erase_draws",
    "erase_noise",
    "cutout_corner",
    *augmix.FEATURES,
)


# data.augment.auto_augment -> (its draws from an example's seed, its op ranges).
POLICIES = {
    "ta_wide": (trivialaugment.choose, trivialaugment.WIDE_RANGES),
    **{
        name: (functools.partial(autoaugment.choose, policy=name), autoaugment.RANGES)
        for name in autoaugment.POLICIES
    },
}


def op_ranges(config: Preprocessing) -> randaugment.OpRanges | None:
    """The ranges of the op policy that is on (auto_augment's or RandAugment's), or None."""
    if config.augment.auto_augment in POLICIES:
        return POLICIES[config.augment.auto_augment][1]
    return randaugment.RANDAUGMENT_RANGES if config.augment.randaugment_ops else None


def draws_per_example(config: Preprocessing) -> bool:
    """Whether `augment_choices` draws anything: an op policy, random erasing or Cutout."""
    augment = config.augment
    policy = augment.auto_augment == "augmix" or augment.auto_augment in POLICIES
    return bool(
        policy or augment.randaugment_ops or augment.erase_probability or augment.cutout_size
    )


def augment_choices(seed: tf.Tensor, config: Preprocessing) -> dict[str, tf.Tensor]:
    """One example's draws for RandAugment and random erasing, for those that are on.

    Each has its own seed, folded from the example's, so the crop and flip
    draws do not depend on them, nor the ops drawn on whether some are
    skipped or their magnitudes drawn.

    Returns:
      Some of `AUGMENT_FEATURES`: "op_indices" int32 and "op_signs" float32
      [randaugment_ops] (`randaugment.choose_ops`; a skipped op is the
      Identity); with a magnitude std, "op_magnitudes" float32
      [randaugment_ops]; with `auto_augment`, the three of its ops
      (`trivialaugment.choose`, `autoaugment.choose`; magnitudes are bins);
      "erase_draws" float32 [ERASE_DRAWS] and
      "erase_noise" float32 [image_size, image_size, 3]; with Cutout,
      "cutout_corner" int32 [2], its square's top and left; with AugMix, its
      chains and weights for each AugMix view (`augmix.choose`).
    """
    features = {}
    if config.augment.auto_augment == "augmix":
        features.update(augmix.choose(seed, config.augment, max(1, config.augment.views - 1)))
    num_ops = config.augment.randaugment_ops
    if config.augment.auto_augment in POLICIES:
        indices, signs, bins = POLICIES[config.augment.auto_augment][0](seed)
        features.update(op_indices=indices, op_signs=signs, op_magnitudes=bins)
    if num_ops:
        ra_seed = randaugment.sub_seed(seed, randaugment.RANDAUGMENT_STREAM)
        indices, signs = randaugment.choose_ops(ra_seed, num_ops)
        if config.augment.randaugment_prob < 1:
            keep_seed = randaugment.sub_seed(seed, randaugment.KEEP_STREAM)
            keep = randaugment.keep_ops(keep_seed, num_ops, config.augment.randaugment_prob)
            indices = randaugment.skip_ops(indices, keep)
        features.update(op_indices=indices, op_signs=signs)
        if config.augment.randaugment_magnitude_std > 0:
            magnitude_seed = randaugment.sub_seed(seed, randaugment.MAGNITUDE_STREAM)
            features["op_magnitudes"] = randaugment_magnitudes.noisy_magnitudes(
                magnitude_seed,
                num_ops,
                config.augment.randaugment_magnitude,
                config.augment.randaugment_magnitude_std,
            )
    if config.augment.erase_probability:
        erase_seed = randaugment.sub_seed(seed, randaugment.ERASE_STREAM)
        draws = randaugment.erase_draws(erase_seed)
        shape = [config.image_size, config.image_size, config.channels]
        noise = randaugment.erase_noise(erase_seed, draws, config.augment.erase_probability, shape)
        features.update(erase_draws=draws, erase_noise=noise)
    if config.augment.cutout_size:
        cutout_seed = randaugment.sub_seed(seed, randaugment.CUTOUT_STREAM)
        # Wholly inside the image (Page 2018's ResNet-9): top and left in [0, size - side].
        positions = max(1, config.image_size - config.augment.cutout_size + 1)
        corner = tf.random.stateless_uniform([2], cutout_seed, 0, positions, tf.int32)
        features["cutout_corner"] = corner
    return features
