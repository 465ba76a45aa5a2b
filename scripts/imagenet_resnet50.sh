#!/usr/bin/env bash
# Train ResNet-50 on ImageNet with configs/imagenet_resnet50.yaml, or resume it.
#
# Usage:
#   scripts/imagenet_resnet50.sh [TRAIN FLAGS...]
#
#   scripts/imagenet_resnet50.sh                          # start, or resume where it stopped
#   MODEL_DIR=/shared/runs/r50 DATA_DIR=/data/tfds NUM_GPUS=4 scripts/imagenet_resnet50.sh
#   scripts/imagenet_resnet50.sh --batch_size=512         # any train flag; the LR follows the batch
#   scripts/imagenet_resnet50.sh --restart                # start over (see below)
#
# Environment:
#   MODEL_DIR  the run directory (default: runs/imagenet_resnet50, under the
#              current directory).
#   DATA_DIR   the tfds data directory (default: $TFDS_DATA_DIR, else
#              ~/tensorflow_datasets). It holds the prepared imagenet2012, or
#              ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar in
#              DATA_DIR/downloads/manual/, from which the first run prepares it.
#   NUM_GPUS   use the first N GPUs of the machine (--num_towers=N), also on
#              each machine of a multi-machine run; default: every GPU.
#   PYTHON     the interpreter (default: the repository's .venv/bin/python if
#              there is one, else python3).
#
# The recipe: global batch 1024 (8 GPUs x 128), LR 0.1 per 256 examples, 5
# epochs of warmup, divided by 10 at epochs 30, 60 and 80, 90 epochs (112,603
# steps); it evaluates on the 50,000 validation images and saves a checkpoint
# every 5005 steps (4 epochs), keeping the last 3. Expected: about 76% top-1.
#
# Resuming: rerun the same command. The run continues from the newest readable
# checkpoint in MODEL_DIR, entering the data stream where it stopped. Settings
# that change what the run computes (NUM_GPUS included, with the default
# per-GPU BatchNorm) are refused on resume: use the same flags and NUM_GPUS.
# --restart moves MODEL_DIR's contents to MODEL_DIR/previous-<time>/ and starts
# over; pass it once, not in a command that a scheduler reruns.
#
# Preemption: SIGTERM (or Ctrl-C) makes the trainer finish the step in
# progress, save a checkpoint and exit with status 0; rerunning resumes. The
# script execs Python, so a signal sent to the script reaches the trainer.
#
# Several machines: run this script on every machine, with the same flags, the
# same MODEL_DIR on a filesystem every machine sees (only the first worker, the
# chief, writes to it; every worker resumes from it), and TF_CONFIG naming the
# cluster and this machine's place in it. Each machine uses its own GPUs (its
# first NUM_GPUS, if set: give every machine the same number); the batch stays
# global (1024 over 2 machines x 8 GPUs is 64 per GPU; pass
# --batch_size=2048 to keep 128). For two machines:
#   on host0 (the chief):
#     export TF_CONFIG='{"cluster": {"worker": ["host0:12345", "host1:12345"]},
#                        "task": {"type": "worker", "index": 0}}'
#   on host1:
#     export TF_CONFIG='{"cluster": {"worker": ["host0:12345", "host1:12345"]},
#                        "task": {"type": "worker", "index": 1}}'
#   then on both:
#     MODEL_DIR=/shared/runs/imagenet_resnet50 scripts/imagenet_resnet50.sh
#
# Evaluate a checkpoint afterwards (one JSON line per checkpoint):
#   python -m resnet_app.evaluate --model_dir=runs/imagenet_resnet50 --checkpoint=latest
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
model_dir="${MODEL_DIR:-runs/imagenet_resnet50}"
data_dir="${DATA_DIR:-${TFDS_DATA_DIR:-$HOME/tensorflow_datasets}}"
data_dir="${data_dir/#\~/$HOME}" # A quoted ~ is not expanded by the shell.
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then
    PYTHON="$repo/.venv/bin/python"
  else
    PYTHON=python3
  fi
fi

towers=()
if [[ -n "${NUM_GPUS:-}" ]]; then
  towers=("--num_towers=${NUM_GPUS}")
fi

# MODEL_DIR and DATA_DIR stay relative to the caller's directory; the package
# is found through PYTHONPATH.
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m resnet_app.train \
  --config="$repo/configs/imagenet_resnet50.yaml" \
  --model_dir="$model_dir" \
  --data_dir="$data_dir" \
  ${towers[@]+"${towers[@]}"} \
  "$@"
