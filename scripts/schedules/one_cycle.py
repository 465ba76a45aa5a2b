"""A one-cycle learning-rate schedule (Smith 2018), as a user script.

  python -m resnet_app.train --lr_schedule=scripts/schedules/one_cycle.py:one_cycle

The rate rises linearly from START_LR to PEAK_LR over the first PEAK_EPOCH
epochs, falls back to START_LR by epoch 2 * PEAK_EPOCH, then anneals to
FINAL_LR at TOTAL_EPOCHS and stays there.

The value is used as is: the config's learning rate, `batch_scaling` and
warmup do not apply to a script, so PEAK_LR is the rate for your batch size.
Edit the constants (or copy the file) to fit your run, and train for
TOTAL_EPOCHS epochs. Only the standard library is used, so the function is
cheap to call before every step.
"""

START_LR = 0.04  # At step 0; also where the descent of the cycle ends.
PEAK_LR = 0.4  # The top of the cycle.
FINAL_LR = 0.0004  # After the annealing phase, to the end of training.
PEAK_EPOCH = 15.0  # Epochs of the rise; the fall takes as long.
TOTAL_EPOCHS = 35.0  # The annealing phase runs from 2 * PEAK_EPOCH to here.

# (epoch, learning rate) corners; the rate is linear in between.
_KNOTS = (
    (0.0, START_LR),
    (PEAK_EPOCH, PEAK_LR),
    (2 * PEAK_EPOCH, START_LR),
    (TOTAL_EPOCHS, FINAL_LR),
)


def one_cycle(step: int, steps_per_epoch: int) -> float:
    """The learning rate for `step` (counted from 0).

    Args:
      step: the optimizer step.
      steps_per_epoch: steps in one epoch.

    Returns:
      The learning rate.
    """
    epoch = step / steps_per_epoch
    for (epoch0, lr0), (epoch1, lr1) in zip(_KNOTS, _KNOTS[1:]):
        if epoch < epoch1:
            return lr0 + (lr1 - lr0) * (epoch - epoch0) / (epoch1 - epoch0)
    return FINAL_LR
