"""`python -m resnet_app.train`: train and evaluate a ResNet.

    python -m resnet_app.train --dataset=cifar10
    python -m resnet_app.train --config=configs/cifar10_resnet56.yaml --num_towers=2
    python -m resnet_app.train --config=configs/shapes_resnet20.yaml --set optimizer.momentum=0.8
    python -m resnet_app.train --model_dir=runs/shapes_resnet20_20261130-060000  # resume

The config is checked before TensorFlow is imported; the work is done by
`engine/loop.py`'s `train_and_evaluate(config, model_dir)`.
"""

from __future__ import annotations

import os

from absl import flags, logging

from resnet_app.common import (
    auto_precision,
    cli,
    hardware,
    precision,
    run_lock,
    slurm,
    tf_config,
)
from resnet_app.engine import command_line
from resnet_app.engine.command_line import (
    ALLOW_CONFIG_CHANGE,
    MODEL_DIR,
    RESTART,
    check_before_tensorflow,
    config_from_flags,
    default_model_dir,
)

# --help lists the command line's flags as this command's own.
flags.adopt_module_key_flags(command_line)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    resolved = config_from_flags()
    check_before_tensorflow(resolved, MODEL_DIR.value, RESTART.value)
    slurm_worker = slurm.check_before_tensorflow()  # A partial SLURM environment: one line.
    tf_config.check(tf_config.read(), "train")  # Kubernetes' evaluator task, a ps job: one line.
    if MODEL_DIR.value and "TF_CONFIG" not in os.environ and not slurm_worker:
        # A second trainer on a run directory in use, answered before TensorFlow loads
        # (a multi-worker job's workers share the directory).
        run_lock.refuse_if_held(MODEL_DIR.value)
    if onednn := hardware.turn_on_onednn(precision.get(resolved.train.precision).compute_dtype):
        logging.info("%s", onednn)
        auto_precision.auto_choice.cache_clear()  # Its reason named the Eigen kernels.
    from resnet_app.engine import loop, setup
    from resnet_app.evaluation import soup

    model_dir = MODEL_DIR.value or default_model_dir(resolved)
    run = setup.build_run(resolved, model_dir, RESTART.value, ALLOW_CONFIG_CHANGE.value)
    loop.train(run, swa_checkpoint=soup.swa_checkpoint)


if __name__ == "__main__":
    cli.run(main)
