"""Averages a run's checkpoints into one: `resnet-app average`.

  resnet-app average --model_dir=runs/try                  # every kept checkpoint
  resnet-app average --model_dir=runs/try --last=3 --bn_batches=0
  resnet-app average --model_dir=runs/try --best=3         # by the trainer's holdout records
  resnet-app average --model_dir=runs/try --mode=soup      # a greedy soup, held-out split
  resnet-app evaluate --model_dir=runs/try --checkpoint=averaged
  resnet-app export --model_dir=runs/try --checkpoint=averaged --export_dir=out

The mean of each weight over the chosen checkpoints (`--mode=uniform`, timm's
and torchvision's checkpoint averaging), or a greedy soup (`--mode=soup`,
Wortsman et al. 2022): the checkpoints ranked by their score on the run's
held-out split, each kept in the average if it does not lower the score. A
soup never chooses on the test split. BatchNorm's statistics of the average
are measured again on `--bn_batches` training batches (SWA's update; 0 keeps
the averaged statistics). Each checkpoint contributes its moving average of the
weights when the run kept one (`--weights`). The result is written as the
run's averaged checkpoint (`averaged/`, replaced whole) with `averaged.json`,
and its record is printed as one JSON line. See docs/evaluation.md.
"""

from __future__ import annotations

import json
import os

from absl import flags

from resnet_app.common import cli, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.evaluation import soup

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "The run directory.")
_LAST = flags.DEFINE_integer("last", None, "Average the newest N checkpoints (default: all kept).")
_BEST = flags.DEFINE_integer(
    "best", None, "Or the N best by the trainer's evaluations (on a held-out split)."
)
_MODE = flags.DEFINE_enum("mode", "uniform", soup.MODES, "uniform, or a greedy soup.")
_WEIGHTS = flags.DEFINE_enum(
    "weights", "auto", run_dir.WEIGHTS, "Each checkpoint's moving average (auto: when kept)."
)
_BN_BATCHES = flags.DEFINE_integer(
    "bn_batches", 100, "Training batches BatchNorm's statistics are measured on (0: averaged)."
)
_SPLIT = flags.DEFINE_string(
    "split", None, "The split the average is scored on (default: the run's evaluation split)."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "The batch (default: the run's).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Where the run's data is now.")


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if not _MODEL_DIR.value:
        raise ConfigError("give --model_dir, the run whose checkpoints to average")
    if not os.path.isdir(_MODEL_DIR.value):
        raise ConfigError(f"--model_dir={_MODEL_DIR.value} is not a directory")
    request = soup.AverageRequest(
        last=_LAST.value,
        best=_BEST.value,
        mode=_MODE.value,
        weights=_WEIGHTS.value,
        bn_batches=_BN_BATCHES.value,
        split=_SPLIT.value,
        batch_size=_BATCH_SIZE.value,
        data_dir=_DATA_DIR.value,
    )
    record = soup.average_run(_MODEL_DIR.value, request)
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    cli.run(main)
