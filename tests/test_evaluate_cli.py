"""`python -m resnet_app.evaluate` on a tiny trained run, against a NumPy reference.

Its reports (eval_results.json, confusion_matrix.png) are checked here too; the
report module's drawing and JSON details in-process in test_eval_report.py.
"""

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import yaml
from matplotlib import image as mpimg

from resnet_app.data import input_pipeline
from resnet_app.data.shapes import CLASS_NAMES
from resnet_app.nets import factory
from tests.commands import REPO, error_line, run_command, start_command
from tests.conftest import EVAL_EXAMPLES
from tests.test_multiworker import _free_ports


@pytest.fixture
def run(tiny_run):
    """The shared tiny run (tests/conftest.py): checkpoints at steps 2 and 4."""
    return tiny_run


def reference(run, name, split=None, image_size=32):
    """top1, top5, mean cross-entropy, count, labels, arg-max predictions and the
    confusion matrix, from plain model calls and NumPy, at `image_size` (the
    tiny run's: shapes are 32 px)."""
    resolved, model_dir = run
    pipeline = input_pipeline.create_pipeline(
        dataclasses.replace(resolved.data, image_size=image_size)
    )
    model = factory.create_run_model(resolved, pipeline.num_classes, image_size)
    tf.train.Checkpoint(model=model).restore(str(model_dir / name)).expect_partial()
    logits, labels = [], []
    for batch in pipeline.eval_dataset(16, split):
        real = batch["mask"].numpy() > 0  # Drop the padding.
        logits.append(model(batch["image"], training=False).numpy()[real])
        labels.append(batch["label"].numpy()[real])
    logits = np.concatenate(logits).astype(np.float64)
    labels = np.concatenate(labels)
    true_logit = logits[np.arange(len(labels)), labels]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_sum_exp = np.log(np.exp(shifted).sum(axis=1)) + logits.max(axis=1)
    predictions = logits.argmax(axis=1)
    confusion = np.zeros((len(CLASS_NAMES), len(CLASS_NAMES)), np.int64)
    np.add.at(confusion, (labels, predictions), 1)  # Row: true class; column: predicted.
    return {
        "top1": float(np.mean(predictions == labels)),
        "top5": float(np.mean((logits > true_logit[:, None]).sum(axis=1) < 5)),
        "loss": float(np.mean(log_sum_exp - true_logit)),
        "num_examples": len(labels),
        "labels": labels,
        "predictions": predictions,
        "confusion": confusion,
    }


def evaluate_cli(model_dir, *args):
    return run_command("resnet_app.evaluate", f"--model_dir={model_dir}", *args)


def json_lines(result):
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def assert_matches(record, expected):
    assert record["num_examples"] == expected["num_examples"]
    assert record["top1"] == pytest.approx(expected["top1"], abs=1e-9)
    assert record["top5"] == pytest.approx(expected["top5"], abs=1e-9)
    assert record["loss"] == pytest.approx(expected["loss"], rel=1e-5)


def assert_report_matches(record, expected):
    """The record's eval_results.json and confusion_matrix.png, against NumPy."""
    directory = record["report"]
    assert sorted(os.listdir(directory)) == [
        "confusion_matrix.png",
        "eval_results.json",
        "reliability.png",
    ]
    with open(os.path.join(directory, "eval_results.json")) as f:
        report = json.load(f)
    assert {k: report[k] for k in record if k != "report"} == {
        k: v for k, v in record.items() if k != "report"
    }
    confusion = np.array(report["confusion_matrix"])
    np.testing.assert_array_equal(confusion, expected["confusion"])
    assert confusion.sum() == EVAL_EXAMPLES  # Each example once, no padding.
    assert "rows: true class" in report["confusion_matrix_axes"]
    labels, predictions = expected["labels"], expected["predictions"]
    examples = np.bincount(labels, minlength=len(CLASS_NAMES))
    correct = np.bincount(labels[predictions == labels], minlength=len(CLASS_NAMES))
    assert report["classes"] == [
        {
            "id": i,
            "name": CLASS_NAMES[i],
            "examples": int(examples[i]),
            "correct": int(correct[i]),
            "accuracy": float(correct[i] / examples[i]) if examples[i] else None,
            "recall": float(correct[i] / examples[i]) if examples[i] else None,
        }
        for i in range(len(CLASS_NAMES))
    ]
    # Balanced accuracy: the mean recall of the classes with examples.
    recall = correct[examples > 0] / examples[examples > 0]
    assert record["balanced_accuracy"] == pytest.approx(recall.mean())
    np.testing.assert_allclose(
        [r for r in record["per_class_recall"] if r is not None], recall, atol=1e-6
    )
    # The most-confused pair is the largest off-diagonal cell.
    off_diagonal = expected["confusion"] * (1 - np.eye(len(CLASS_NAMES), dtype=np.int64))
    top = report["most_confused"][0]
    assert top["count"] == off_diagonal.max() > 0
    assert off_diagonal[top["true_id"], top["predicted_id"]] == top["count"]
    assert top["true_name"] == CLASS_NAMES[top["true_id"]]
    picture = mpimg.imread(os.path.join(directory, "confusion_matrix.png"))
    assert picture.ndim == 3 and min(picture.shape[:2]) > 300


def files_and_sizes(model_dir):
    """Every file under the run directory but metrics.jsonl and the reports, with its size."""
    found = {}
    for parent, _, names in os.walk(model_dir):
        for name in names:
            path = os.path.join(parent, name)
            found[os.path.relpath(path, model_dir)] = os.path.getsize(path)
    found.pop("metrics.jsonl")
    return {path: size for path, size in found.items() if not path.startswith("reports/")}


def read_metrics(model_dir):
    with open(model_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def test_latest_matches_numpy_and_is_appended_to_metrics(run):
    _, model_dir = run
    before, other_files = len(read_metrics(model_dir)), files_and_sizes(model_dir)
    [record] = json_lines(evaluate_cli(model_dir))
    expected = reference(run, "ckpt-4")
    assert expected["num_examples"] == EVAL_EXAMPLES
    assert {k: record[k] for k in ("checkpoint", "step", "split")} == {
        "checkpoint": "ckpt-4",
        "step": 4,
        "split": "test",
    }
    assert_matches(record, expected)
    assert read_metrics(model_dir)[before:] == [{**record, "event": "evaluation"}]
    # No TensorBoard events, nothing else but the report, in its default place.
    assert files_and_sizes(model_dir) == other_files
    assert record["report"] == str(model_dir / "reports" / "ckpt-4-test")
    assert_report_matches(record, expected)


def test_a_run_trained_at_another_size_is_evaluated_at_it(run, tmp_path):
    """A run whose data_info.json records 40 px (as one trained before the image-size
    rule would, its preset's size winning over the dataset's 32 px) is evaluated at
    40 px, as it was trained, not at the 32 px the rule gives a new run."""
    _, model_dir = run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    info = json.loads((copy / "data_info.json").read_text())
    info["preprocessing"]["image_size"] = 40
    (copy / "data_info.json").write_text(json.dumps(info))
    [record] = json_lines(evaluate_cli(copy))
    expected = reference(run, "ckpt-4", image_size=40)
    assert_matches(record, expected)
    # Beyond assert_matches's tolerance: the 32-px numbers would not pass.
    assert expected["loss"] != pytest.approx(reference(run, "ckpt-4")["loss"], rel=1e-4)


def test_all_gives_one_line_per_checkpoint(run):
    _, model_dir = run
    records = json_lines(evaluate_cli(model_dir, "--checkpoint=all"))
    assert [(r["checkpoint"], r["step"]) for r in records] == [("ckpt-2", 2), ("ckpt-4", 4)]
    assert_matches(records[1], reference(run, "ckpt-4"))
    assert records[0]["loss"] != records[1]["loss"]  # Each line is its own checkpoint.


def test_a_named_checkpoint_with_moved_data(run, tmp_path):
    _, model_dir = run
    moved = tmp_path / "moved"
    result = evaluate_cli(model_dir, "--checkpoint=ckpt-2", f"--data_dir={moved}")
    [record] = json_lines(result)
    assert record["step"] == 2 and record["checkpoint"] == "ckpt-2"
    assert_matches(record, reference(run, "ckpt-2"))
    assert os.listdir(moved)  # The shapes cache was read from (here: made in) the new place.


def test_reports_on_three_towers_with_padding_match_numpy(run, tmp_path):
    _, model_dir = run
    before = len(read_metrics(model_dir))
    # 37 examples in batches of 9 (3 per tower): the last batch is mostly padding.
    result = evaluate_cli(
        model_dir,
        "--checkpoint=all",
        "--num_towers=3",
        "--batch_size=9",
        f"--report_dir={tmp_path / 'reports'}",
    )
    records = json_lines(result)
    assert [r["report"] for r in records] == [
        str(tmp_path / "reports" / "ckpt-2-test"),
        str(tmp_path / "reports" / "ckpt-4-test"),
    ]
    for record in records:
        expected = reference(run, record["checkpoint"])
        assert_matches(record, expected)
        assert_report_matches(record, expected)
    assert read_metrics(model_dir)[before:] == [{**r, "event": "evaluation"} for r in records]
    assert "Per-class accuracy of ckpt-4 on test, worst first: " in result.stderr


def test_without_matplotlib_the_json_is_still_written(run, tmp_path):
    _, model_dir = run
    # A matplotlib that fails to import, first on the path, as if it were not installed.
    (tmp_path / "shim" / "matplotlib").mkdir(parents=True)
    (tmp_path / "shim" / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('No module named matplotlib (test shim)')\n"
    )
    result = run_command(
        "resnet_app.evaluate",
        f"--model_dir={model_dir}",
        "--checkpoint=ckpt-2",
        f"--report_dir={tmp_path / 'reports'}",
        env={"PYTHONPATH": f"{tmp_path / 'shim'}{os.pathsep}{REPO}"},
    )
    [record] = json_lines(result)
    assert os.listdir(record["report"]) == ["eval_results.json"]  # No picture, no temp file.
    with open(os.path.join(record["report"], "eval_results.json")) as f:
        report = json.load(f)
    expected = reference(run, "ckpt-2")
    np.testing.assert_array_equal(report["confusion_matrix"], expected["confusion"])
    [warning] = [line for line in result.stderr.splitlines() if "requirements-plot.txt" in line]
    assert warning.startswith("W") and "Skipped confusion_matrix.png" in warning  # absl: W....


def test_another_split_on_three_towers(run):
    _, model_dir = run
    result = evaluate_cli(model_dir, "--split=train", "--num_towers=3", "--batch_size=8")
    [record] = json_lines(result)
    assert record["split"] == "train"
    # eval_examples limits whichever split is evaluated.
    assert_matches(record, reference(run, "ckpt-4", split="train"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model_dir={tmp}/nowhere"], "must be a run directory written by"),
        (["--model_dir={tmp}"], "must be a run directory written by"),
        (["--model_dir={run}", "--checkpoint=ckpt-99"], "one of: ckpt-2, ckpt-4"),
        (
            ["--model_dir={run}", "--batch_size=0"],
            "--batch_size must be a whole number >= 1, got 0",
        ),
        (["--model_dir={run}", "extra"], "unexpected argument"),
        (["--model_dir={run}", "--report_dir={run}/config.yaml/x"], "cannot create it"),
    ],
)
def test_mistakes_are_one_line(run, tmp_path, args, message):
    _, model_dir = run
    args = [a.format(tmp=tmp_path, run=model_dir) for a in args]
    assert message in error_line(run_command("resnet_app.evaluate", *args))


def test_truncated_latest_falls_back_to_the_one_before(run, tmp_path):
    _, model_dir = run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    [data_file] = [name for name in os.listdir(copy) if name.startswith("ckpt-4.data")]
    with open(copy / data_file, "r+b") as f:
        f.truncate(os.path.getsize(copy / data_file) // 2)
    result = evaluate_cli(copy, "--checkpoint=latest")
    [record] = json_lines(result)
    assert record["step"] == 2
    assert "falling back to the one before it" in result.stderr
    assert_matches(record, reference(run, "ckpt-2"))


def test_checkpoint_of_another_model_is_one_line(run, tmp_path):
    _, model_dir = run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    with open(copy / "config.yaml") as f:
        tree = yaml.safe_load(f)
    tree["model"] = {"name": "resnet20"}
    with open(copy / "config.yaml", "w") as f:
        yaml.safe_dump(tree, f)
    line = error_line(evaluate_cli(copy))
    assert f"checkpoint {copy / 'ckpt-4'} does not match" in line


def evaluate_on_two_workers(model_dir, *args):
    """`evaluate` on 2 workers on 127.0.0.1 (TF_CONFIG); their (status, stdout, stderr)."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        processes.append(
            start_command(
                "resnet_app.evaluate",
                f"--model_dir={model_dir}",
                *args,
                env={"TF_CONFIG": json.dumps(tf_config)},
            )
        )
    results = []
    for process in processes:
        output, errors = process.communicate(timeout=300)
        results.append((process.returncode, output, errors))
    return results


def test_two_workers_count_every_example_once_and_the_chief_reports(run, tmp_path):
    """2 workers, 4 examples each per step: both print the NumPy reference's numbers;
    the matrix summed across workers counts 37; metrics.jsonl gets one record."""
    _, model_dir = run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    before = len(read_metrics(copy))
    records = []
    for status, output, errors in evaluate_on_two_workers(
        copy, "--batch_size=8", f"--report_dir={tmp_path / 'reports'}"
    ):
        assert status == 0, errors[-3000:]
        records.append(json.loads(output))
    assert records[0] == records[1]
    expected = reference(run, "ckpt-4")
    assert_matches(records[0], expected)
    assert_report_matches(records[0], expected)
    assert read_metrics(copy)[before:] == [{**records[0], "event": "evaluation"}]

    # A report directory only the chief checks (and cannot make): both stop at
    # once with one line each, rather than one waiting for the other.
    (tmp_path / "file").write_text("")
    chief, other = evaluate_on_two_workers(copy, f"--report_dir={tmp_path / 'file' / 'reports'}")
    for status, _, errors in (chief, other):
        assert status == 2 and "Traceback" not in errors, errors[-3000:]
    assert "error: --report_dir=" in chief[2] and "cannot create it" in chief[2]
    assert "error: another worker refused to evaluate" in other[2]


def test_a_shared_report_dir_never_overwrites_another_runs_report(run, tmp_path):
    _, model_dir = run
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    reports = tmp_path / "reports"
    (record,) = json_lines(evaluate_cli(other, f"--report_dir={reports}"))
    written = (reports / "ckpt-4-test" / "eval_results.json").read_text()
    assert json.loads(written)["model_dir"] == str(other)
    records_before = read_metrics(model_dir)
    line = error_line(evaluate_cli(model_dir, f"--report_dir={reports}"))
    assert f"holds the report of another run ({other})" in line
    assert read_metrics(model_dir) == records_before  # Refused before evaluating.
    assert (reports / "ckpt-4-test" / "eval_results.json").read_text() == written
    assert len(json_lines(evaluate_cli(other, f"--report_dir={reports}"))) == 1  # Its own: fine.


def read_only(monkeypatch, directory):
    """Every write under `directory` fails as on a read-only mount (EROFS), in this process.

    (A real read-only directory cannot be made here: root ignores the mode bits.)
    """
    import builtins
    import errno

    root = os.path.realpath(directory)

    def inside(path) -> bool:
        path = os.path.realpath(os.fspath(path))
        return path == root or path.startswith(root + os.sep)

    def refuse(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    real_os_open, real_open = os.open, builtins.open

    def os_open(path, flags, *args, **kwargs):
        if flags & writes and inside(path):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+") and inside(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def refusing(real):
        def call(path, *args, **kwargs):
            if inside(path):
                refuse(path)
            return real(path, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    for name in ("mkdir", "unlink", "remove", "rename", "replace", "rmdir"):
        monkeypatch.setattr(os, name, refusing(getattr(os, name)))


def test_a_read_only_run_is_evaluated_with_its_reports_elsewhere(run, tmp_path, monkeypatch):
    from resnet_app.common.errors import ConfigError
    from resnet_app.evaluation import checkpoint_eval, temperature

    _, model_dir = run
    metrics_before = (model_dir / "metrics.jsonl").read_bytes()
    read_only(monkeypatch, model_dir)
    [record] = checkpoint_eval.evaluate_checkpoints(
        str(model_dir), "latest", report_dir=str(tmp_path / "reports")
    )
    # The trainer's own evaluation at step 4 (not a record `evaluate` appended).
    [trained] = [
        r
        for r in read_metrics(model_dir)
        if r["step"] == 4 and "checkpoint" not in r and "top1" in r
    ]
    assert record["top1"] == trained["top1"]
    assert os.path.isfile(os.path.join(record["report"], "eval_results.json"))
    assert (model_dir / "metrics.jsonl").read_bytes() == metrics_before
    # Reports into the run directory, or a temperature fitted into it: one line, before any work.
    with pytest.raises(ConfigError, match="pass --report_dir=DIR to write them elsewhere"):
        checkpoint_eval.evaluate_checkpoints(str(model_dir), "latest")
    with pytest.raises(ConfigError, match="temperature.json into the run directory .* cannot be"):
        temperature.fit_run_temperature(str(model_dir), "latest")
