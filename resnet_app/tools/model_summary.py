"""`resnet-app model`: what a ResNet costs, stage by stage (`nets/summary.py`).

resnet-app model --model=resnet20 --num_classes=100 --json
"""

from __future__ import annotations

import json
import sys

from absl import flags

from resnet_app.common import cli
from resnet_app.nets import presets
from resnet_app.nets import summary as summary_lib

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, f"Preset name: {', '.join(presets.model_names())}.")
flags.DEFINE_integer("num_classes", None, "Width of the logits (default: the preset's).")
flags.DEFINE_integer(
    "image_size", None, "Input height and width (default: 224 for ImageNet presets, else 32)."
)
flags.DEFINE_boolean("json", False, "Print one JSON object instead of a table.")
flags.mark_flag_as_required("model")


def main(argv: list[str]) -> None:
    """Prints the summary that the flags ask for."""
    cli.reject_positional(argv)
    overrides = {} if FLAGS.num_classes is None else {"num_classes": FLAGS.num_classes}
    summary = summary_lib.summarize(FLAGS.model, FLAGS.image_size, **overrides)
    output = json.dumps(summary) if FLAGS.json else summary_lib.format_summary(summary)
    sys.stdout.write(output + "\n")


if __name__ == "__main__":
    cli.run(main)
