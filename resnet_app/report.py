"""`resnet-app report`: one HTML page of what a run's checkpoint learned.

    resnet-app report --model_dir=runs/try
    resnet-app report --model_dir=runs/try --checkpoint=best --split=train --top_losses=50

Evaluates the checkpoint as `resnet-app evaluate` does (its JSON record on
stdout, eval_results.json and pictures) and, from that same pass, writes
report.html into its report directory: the run at a glance, its curves, the
worst mistakes with Grad-CAM, the most confused pairs, calibration and the
per-class table; and predictions.npz (each example's id, label and logits).
The page opens from disk with no network. See docs/evaluation.md.
"""

from __future__ import annotations

from absl import flags

from resnet_app.common import cli, fields

cli.define_checkpoint_flags()
_TOP_LOSSES = flags.DEFINE_integer(
    "top_losses", 25, "How many of the split's highest-loss examples the page shows (1 to 200)."
)
MAX_TOP_LOSSES = 200  # At 96 px, about 2 MB of images; more than a reader looks through.


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    fields.interval(1, MAX_TOP_LOSSES, high_in=True).check("--top_losses", _TOP_LOSSES.value)
    from resnet_app.evaluation import checkpoint_eval

    checkpoint_eval.evaluate_checkpoints(
        flags.FLAGS.model_dir,
        flags.FLAGS.checkpoint,
        top_losses=_TOP_LOSSES.value,
        on_record=cli.print_record,
        **cli.flag_values("split", "report_dir", "batch_size", "num_towers", "data_dir", "weights"),
    )


if __name__ == "__main__":
    cli.run(main)
