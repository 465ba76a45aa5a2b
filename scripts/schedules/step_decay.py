"""Step decay as a user script: the learning rate divided by 10 every 30 epochs.

  python -m resnet_app.train --lr_schedule=scripts/schedules/step_decay.py:step_decay

The ImageNet schedule of PyTorch's example trainer, `lr * 0.1 ** (epoch // 30)`:
BASE_LR for epochs 0-29, BASE_LR / 10 for epochs 30-59, and so on.

The value is used as is: the config's learning rate, `batch_scaling` and warmup
do not apply to a script, so BASE_LR is the rate for your batch size. Edit the
constants to change it. Only the standard library is used.
"""

BASE_LR = 0.1  # For epochs 0 to EPOCHS_PER_DECAY - 1.
DECAY = 0.1  # The factor applied every EPOCHS_PER_DECAY epochs.
EPOCHS_PER_DECAY = 30  # Whole epochs between two drops.


def step_decay(step: int, steps_per_epoch: int) -> float:
    """The learning rate for `step` (counted from 0).

    Args:
      step: the optimizer step.
      steps_per_epoch: steps in one epoch.

    Returns:
      The learning rate.
    """
    # Whole epochs, in integers: the drop happens exactly at step 30 * steps_per_epoch.
    drops = step // (EPOCHS_PER_DECAY * steps_per_epoch)
    return BASE_LR * DECAY**drops
