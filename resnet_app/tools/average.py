"""Averages a run's checkpoints into one: `resnet-app average`.

  resnet-app average --model_dir=runs/try --last=3 --bn_batches=0
  resnet-app average --model_dir=runs/try --mode=soup      # a greedy soup, held-out split
  resnet-app evaluate --model_dir=runs/try --checkpoint=averaged

The mean of each weight, or a greedy soup (Wortsman et al. 2022), BatchNorm
measured again, written to `averaged/`; its record is one JSON line. See
docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import flags

from resnet_app.common import cli, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.evaluation import soup

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "The run directory.")
flags.DEFINE_integer("last", None, "Average the newest N checkpoints (default: all kept).")
flags.DEFINE_integer(
    "best", None, "Or the N best by the trainer's evaluations (on a held-out split)."
)
flags.DEFINE_enum("mode", "uniform", soup.MODES, "uniform, or a greedy soup.")
flags.DEFINE_enum(
    "weights", "auto", run_dir.WEIGHTS, "Each checkpoint's moving average (auto: when kept)."
)
flags.DEFINE_integer(
    "bn_batches", 100, "Training batches BatchNorm's statistics are measured on (0: averaged)."
)
flags.DEFINE_string(
    "split", None, "The split the average is scored on (default: the run's evaluation split)."
)
flags.DEFINE_integer("batch_size", None, "The batch (default: the run's).")
flags.DEFINE_string("data_dir", None, "Where the run's data is now.")


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if not _MODEL_DIR.value:
        raise ConfigError("give --model_dir, the run whose checkpoints to average")
    if not os.path.isdir(_MODEL_DIR.value):
        raise ConfigError(f"--model_dir={_MODEL_DIR.value} is not a directory")
    # Each field of the request is the flag of that name.
    names = [field.name for field in dataclasses.fields(soup.AverageRequest)]
    record = soup.average_run(_MODEL_DIR.value, soup.AverageRequest(**cli.flag_values(*names)))
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    cli.run(main)
