"""`resnet-app plot` (`tools/plot_metrics.py`): runs' curves from metrics.jsonl (newest attempt).

The file is read by `common/metrics.py`'s reader, which tests and tools share.
"""

import json
import os

import matplotlib.image
import numpy as np
import pytest

from resnet_app.common import files, metrics
from resnet_app.tools import plot_metrics
from tests.commands import REPO, blocked_packages, error_line, run_command


def write_run(run_dir, records, tail=""):
    """A hand-written metrics.jsonl: one line per record, then `tail` as is."""
    run_dir.mkdir(parents=True)
    lines = "".join(json.dumps(record) + "\n" for record in records)
    (run_dir / "metrics.jsonl").write_text(lines + tail)
    return run_dir


def start(step):
    return {"step": step, "event": "start", "total_steps": 40}


def trained(step, loss, accuracy=0.5, learning_rate=0.1):
    """A training record as the trainer writes it (64 examples per epoch, batch 16)."""
    return {
        "step": step,
        "epoch": step * 16 / 64,
        "loss": loss,
        "accuracy": accuracy,
        "learning_rate": learning_rate,
        "examples_per_sec": 100.0,
        "input_wait": 0.01,
        "time": 1.0e9 + step,
    }


def evaluated(step, top1, split="test"):
    """The trainer's evaluation record."""
    return {"step": step, "split": split, "top1": top1, "top5": 1, "loss": 1, "num_examples": 37}


def panel(figure, title):
    """{label: line's (x, y) points} of the panel whose title starts with `title`."""
    (axis,) = [axis for axis in figure.axes if axis.get_title().startswith(title)]
    return {line.get_label(): line.get_xydata() for line in axis.lines}


def test_tiny_run(tiny_run, tmp_path):
    resolved, run_dir = tiny_run
    metrics_file = run_dir / "metrics.jsonl"
    before = metrics_file.read_bytes()
    out = tmp_path / "curves.png"
    # A TensorFlow that cannot be imported: the script must not need it.
    fake = blocked_packages(tmp_path / "fake", "tensorflow")
    result = run_command(
        "resnet_app.tools.plot_metrics",
        str(run_dir),
        f"--out={out}",
        env={"PYTHONPATH": f"{fake}{os.pathsep}{REPO}"},
    )
    assert result.returncode == 0, result.stderr
    assert f"Wrote {out}" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["curves.png", "fake"]  # No temporary file left.
    image = matplotlib.image.imread(out)  # Reads PNG files only.
    width, height = plot_metrics.FIGURE_SIZE
    assert image.shape == (round(height * plot_metrics.DPI), round(width * plot_metrics.DPI), 4)
    assert image[..., :3].std() > 0.05  # Something is drawn.
    assert metrics_file.read_bytes() == before
    assert plot_metrics.METRICS_FILE == metrics.METRICS_FILE

    # The reference: the file's records, read with json.
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    training = [r for r in records if "event" not in r and "accuracy" in r]
    evaluations = [r for r in records if "event" not in r and "top1" in r]
    train = resolved.train
    # Records every log_every and eval_every steps (both 2 of 4).
    assert [r["step"] for r in training] == list(range(2, train.train_steps + 1, train.log_every))
    assert [r["step"] for r in evaluations] == list(range(2, train.train_steps + 1, 2))

    curves = {"run": plot_metrics.load_curves(str(run_dir))}
    for x in ("step", "epoch"):
        figure = plot_metrics.plot_curves(curves, x=x)
        for title, key, chosen in [
            ("training loss", "loss", training),
            ("training accuracy", "accuracy", training),
            ("learning rate", "learning_rate", training),
            ("evaluation top-1 (test)", "top1", evaluations),
        ]:
            if x == "step":
                xs = [r["step"] for r in chosen]
            else:  # An epoch is batch_size examples per step over the training examples.
                xs = [r["step"] * train.batch_size / resolved.data.train_examples for r in chosen]
            expected = np.array([xs, [r[key] for r in chosen]]).T
            lines = panel(figure, title)
            assert list(lines) == ["run"], title
            np.testing.assert_allclose(lines["run"], expected, rtol=1e-12, err_msg=title)
            assert figure.axes[0].get_xlabel() == x


def test_two_runs_with_the_same_name_share_the_figure(tmp_path):
    losses = {"a/run": [2.0, 1.5], "b/run": [2.2, 1.9], "other": [3.0, 2.5]}
    run_dirs = []
    for label, (first, second) in losses.items():
        run_dirs.append(
            write_run(
                tmp_path / label,
                [start(0), trained(10, first), evaluated(10, first / 10), trained(20, second)],
            )
        )
    figure = plot_metrics.plot_runs([str(d) for d in run_dirs])
    for title in ("training loss", "training accuracy", "evaluation top-1", "learning rate"):
        lines = panel(figure, title)
        assert list(lines) == list(losses), title
    colours = [line.get_color() for line in figure.axes[0].lines]
    assert len(set(colours)) == 3
    loss, top1 = panel(figure, "training loss"), panel(figure, "evaluation top-1")
    for label, (first, second) in losses.items():
        np.testing.assert_allclose(loss[label], [[10, first], [20, second]])
        np.testing.assert_allclose(top1[label], [[10, first / 10]])
    assert [text.get_text() for text in figure.legends[0].get_texts()] == list(losses)


def append(run_dir, records):
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)


def test_resumed_run_keeps_the_newest_attempt(tmp_path):
    run_dir = write_run(
        tmp_path / "run",
        [
            start(0),
            trained(10, 1.0),
            trained(20, 0.9),
            evaluated(20, 0.20),  # The checkpoint at step 20 is saved after this.
            trained(30, 0.8),
            evaluated(30, 0.30),
            # Killed before the checkpoint at 30 was complete; resumed from step 20.
            start(20),
            trained(30, 0.7),
            evaluated(30, 0.31),
            trained(40, 9.9),
            # The weights are not finite at the evaluation of step 40.
            {"step": 40, "event": "rollback", "to_step": 30, "lr_scale": 0.5},
            trained(35, 0.65, learning_rate=0.05),
            {"step": 35, "event": "stopped", "signal": "SIGTERM"},
        ],
    )
    curves = plot_metrics.load_curves(str(run_dir))
    assert curves.train["loss"] == ([10, 20, 30, 35], [1.0, 0.9, 0.7, 0.65])
    assert curves.train["learning_rate"] == ([10, 20, 30, 35], [0.1, 0.1, 0.1, 0.05])
    assert curves.top1 == {"test": ([20, 30], [0.20, 0.31])}

    append(
        run_dir,
        [
            start(35),
            trained(40, 0.6, learning_rate=0.05),
            evaluated(40, 0.41),
            {"step": 40, "event": "end", "seconds": 1.0},
            # Resumed at the end: the trainer evaluates the last checkpoint again.
            start(40),
            evaluated(40, 0.42),
            {"step": 40, "event": "end", "seconds": 1.0},
            # An evaluation of a checkpoint by `python -m resnet_app.evaluate`: not drawn.
            {**evaluated(40, 0.99, split="train"), "checkpoint": "ckpt-40", "event": "evaluation"},
        ],
    )
    curves = plot_metrics.load_curves(str(run_dir))
    assert curves.train["loss"] == ([10, 20, 30, 35, 40], [1.0, 0.9, 0.7, 0.65, 0.6])
    assert curves.train["epoch"] == ([10, 20, 30, 35, 40], [2.5, 5.0, 7.5, 8.75, 10.0])
    assert curves.top1 == {"test": ([20, 30, 40], [0.20, 0.31, 0.42])}

    # A restart from scratch drops everything before it.
    append(run_dir, [start(0), trained(10, 5.0)])
    curves = plot_metrics.load_curves(str(run_dir))
    assert curves.train["loss"] == ([10], [5.0])
    assert curves.top1 == {}


def test_changed_evaluation_split_gets_its_own_line(tmp_path):
    run_dir = write_run(
        tmp_path / "run",
        [start(0), trained(10, 1.0), evaluated(10, 0.1), start(10), evaluated(20, 0.2, "holdout")],
    )
    figure = plot_metrics.plot_runs([str(run_dir)], x="epoch")
    lines = panel(figure, "evaluation top-1 (holdout, test)")
    assert sorted(lines) == ["run (holdout)", "run (test)"]
    # Epochs at the training records' ratio: 16 examples per step, 64 per epoch.
    np.testing.assert_allclose(lines["run (test)"], [[2.5, 0.1]])
    np.testing.assert_allclose(lines["run (holdout)"], [[5.0, 0.2]])


def test_partial_last_line_is_skipped_with_a_warning(tmp_path, caplog):
    records = [start(0), trained(10, 1.0), evaluated(10, 0.1), trained(20, 0.9)]
    run_dir = write_run(tmp_path / "run", records, tail='{"step": 30, "epoch": 7.5, "lo')
    curves = plot_metrics.load_curves(str(run_dir))
    assert curves.train["loss"] == ([10, 20], [1.0, 0.9])
    assert curves.top1 == {"test": ([10], [0.1])}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert str(run_dir / "metrics.jsonl") in warnings[0] and "line(s) 5 " in warnings[0]


def test_record_appended_to_a_partial_line_still_counts(tmp_path, caplog):
    # Killed while writing step 40's record, resumed from step 20: the resumed
    # run's start event goes at the end of the unfinished line.
    partial = '{"step": 40, "epoch": 10.0, "loss": 0.6, "accu'
    run_dir = write_run(
        tmp_path / "run",
        [
            start(0),
            trained(10, 1.0),
            trained(20, 0.9),
            evaluated(20, 0.2),
            trained(30, 0.8),
            evaluated(30, 0.3),
        ],
        tail=partial + json.dumps(start(20)) + "\n" + json.dumps(trained(30, 0.7)) + "\n",
    )
    curves = plot_metrics.load_curves(str(run_dir))
    assert curves.train["loss"] == ([10, 20, 30], [1.0, 0.9, 0.7])
    assert curves.top1 == {"test": ([20], [0.2])}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "line(s) 7 " in warnings[0], warnings


def test_failed_save_leaves_the_previous_picture(tmp_path):
    out = tmp_path / "curves.png"
    out.write_bytes(b"the previous picture")

    class FailingFigure:
        def savefig(self, path, **kwargs):
            with open(path, "wb") as f:
                f.write(b"half a pic")
            raise OSError("No space left on device")

    with pytest.raises(OSError):
        files.save_figure(FailingFigure(), str(out))
    assert out.read_bytes() == b"the previous picture"
    assert os.listdir(tmp_path) == ["curves.png"]


def test_run_labels():
    assert plot_metrics.run_labels(["/r/a/x/run", "/r/b/x/run", "/r/c/run", "/r/solo/"]) == [
        "a/x/run",
        "b/x/run",
        "c/run",
        "solo",
    ]


@pytest.fixture
def good_run(tmp_path):
    return write_run(tmp_path / "good", [start(0), trained(10, 1.0)])


TRAINER = "written by `python -m resnet_app.train`"
# The one-line error of each mistake.
MISTAKES = {
    "no run": f"no RUN_DIR: give one or more run directories {TRAINER}",
    "missing": f"missing does not exist; RUN_DIR should be a directory {TRAINER}",
    "empty": f"empty has no metrics.jsonl; RUN_DIR should be a directory {TRAINER}",
    "twice": "good/ is {good} again; give each run directory once",
    "out directory": "nowhere does not exist",
    "no matplotlib": "matplotlib: pip install -r requirements-plot.txt",
}


@pytest.mark.parametrize("case", MISTAKES)
def test_mistakes_get_one_line(case, good_run, tmp_path):
    (tmp_path / "empty").mkdir()
    out = f"--out={tmp_path / 'curves.png'}"
    env = None
    args = {
        "no run": [out],
        "missing": [str(tmp_path / "missing"), out],
        "empty": [str(good_run), str(tmp_path / "empty"), out],
        "twice": [str(good_run), f"{good_run}/", out],
        "out directory": [str(good_run), f"--out={tmp_path / 'nowhere' / 'curves.png'}"],
        "no matplotlib": [str(good_run), out],
    }[case]
    if case == "no matplotlib":
        fake = blocked_packages(tmp_path / "fake", "matplotlib")
        env = {"PYTHONPATH": f"{fake}{os.pathsep}{REPO}"}
    line = error_line(run_command("resnet_app.tools.plot_metrics", *args, env=env))
    assert MISTAKES[case].format(good=good_run) in line, line
    assert not (tmp_path / "curves.png").exists()


def test_the_moving_average_gets_its_own_line(tmp_path):
    records = [start(0), trained(10, 1.0), {**evaluated(10, 0.1), "ema_top1": 0.3}]
    run_dir = write_run(tmp_path / "run", records)
    figure = plot_metrics.plot_runs([str(run_dir)], x="step")
    lines = panel(figure, "evaluation top-1 (test)")  # Each split named once.
    assert sorted(lines) == ["run (test)", "run (test, EMA)"]
    np.testing.assert_allclose(lines["run (test, EMA)"], [[10, 0.3]])


def test_a_multi_label_run_is_drawn_by_its_map(tmp_path):
    records = [start(0), trained(10, 1.0), {**evaluated(10, 0.9), "map": 0.4}]
    records.append({**evaluated(20, 0.95), "map": 0.6, "ema_map": 0.65, "ema_top1": 0.9})
    run_dir = write_run(tmp_path / "tags", records)
    figure = plot_metrics.plot_runs([str(run_dir)])
    lines = panel(figure, "evaluation mAP (test)")
    np.testing.assert_allclose(lines["tags (test, mAP)"], [[10, 0.4], [20, 0.6]])
    np.testing.assert_allclose(lines["tags (test, mAP, EMA)"], [[20, 0.65]])
