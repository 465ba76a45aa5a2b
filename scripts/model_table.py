"""docs/models.md's table of every preset: depth, parameters and MACs (markdown).

  python scripts/model_table.py [--models=resnet20,resnet50]

MACs per image at the preset's native size, as `resnet-app model` counts them.
"""

import sys

from absl import flags

from resnet_app.common import cli
from resnet_app.nets import presets
from resnet_app.nets.summary import format_count, summarize

_MODELS = flags.DEFINE_list("models", None, "Presets to list (default: all that users can pick).")


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    names = _MODELS.value or presets.model_names()
    rows = [
        "| preset | block | version | depth | params | MACs |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for name in names:
        config = presets.get_config(name)
        summary = summarize(name)
        rows.append(
            f"| {name} | {config.block} | {config.version} | {config.depth} | "
            f"{summary['trainable_params']:,} | {format_count(summary['macs'])} |"
        )
        sys.stdout.write(rows[-1] + "\n" if len(rows) > 3 else "\n".join(rows) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
