"""`resnet-app average`: the mean of checkpoints against NumPy, BatchNorm measured, greedy soups."""

import itertools
import json
import os
import shutil

import numpy as np
import pytest

from resnet_app.common import averaged_checkpoint, checkpoint
from resnet_app.common.errors import ConfigError
from resnet_app.evaluation import checkpoint_eval, soup
from tests import runs
from tests.commands import error_line, run_command

STATISTICS = ("moving_mean", "moving_variance")


def _weights(resolved, prefix):
    """{variable path: value} of the model a checkpoint holds (restored by object graph:
    a training checkpoint names a variable by the first path that reaches it)."""
    from resnet_app.nets import factory

    model = factory.create_run_model(resolved, 10, 32, "fp32")
    checkpoint.restore_model(model, prefix, "raw")
    return {variable.path: variable.numpy() for variable in model.weights}


def _conv_same(images, kernel):
    """A stride-1 'same' convolution in NumPy (odd kernel, zero padding)."""
    k = kernel.shape[0]
    padded = np.pad(images, [(0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)])
    height, width = images.shape[1:3]
    out = np.zeros((*images.shape[:3], kernel.shape[-1]))
    for i, j in itertools.product(range(k), range(k)):
        out += padded[:, i : i + height, j : j + width, :] @ kernel[i, j]
    return out


@pytest.fixture
def copied_run(tiny_run, tmp_path):
    resolved, run = tiny_run
    model_dir = tmp_path / "run"
    shutil.copytree(run, model_dir)
    return resolved, model_dir


def test_the_average_is_the_mean_and_batch_norm_is_measured_on_training_batches(copied_run):
    resolved, model_dir = copied_run
    sources = [_weights(resolved, str(model_dir / f"ckpt-{step}")) for step in (2, 4)]
    request = soup.AverageRequest(bn_batches=0, batch_size=8)
    record = soup.average_run(str(model_dir), request)
    assert record["members"] == ["ckpt-2", "ckpt-4"] and record["step"] == 4
    averaged = _weights(resolved, record["checkpoint"])
    assert set(averaged) == set(sources[0])
    for name, value in averaged.items():
        mean = (sources[0][name].astype(np.float64) + sources[1][name]) / 2
        np.testing.assert_allclose(value, mean, rtol=1e-6, atol=1e-8, err_msg=name)
    # `--checkpoint=averaged` evaluates those weights: the record the command wrote.
    [evaluated] = checkpoint_eval.evaluate_checkpoints(str(model_dir), "averaged", batch_size=8)
    assert evaluated["checkpoint"] == "avg-4"
    assert evaluated["top1"] == record["evaluation"]["top1"]

    # BatchNorm measured on 2 training batches: the stem BN's statistics are the mean
    # of its input's batch moments (the stem convolution, in NumPy), and every other
    # variable is still the mean.
    record = soup.average_run(str(model_dir), soup.AverageRequest(bn_batches=2, batch_size=8))
    assert record["bn_batches"] == 2
    measured = _weights(resolved, record["checkpoint"])
    from resnet_app.data import run_pipeline

    pipeline = run_pipeline.create_run_pipeline(resolved, resolved.data, str(model_dir))
    batches = list(itertools.islice(iter(pipeline.train_dataset(8)), 2))
    kernel = measured["tiny/stem_conv/kernel"]
    outputs = [_conv_same(b["image"].numpy().astype(np.float64), kernel) for b in batches]
    np.testing.assert_allclose(
        measured["tiny/stem_bn/moving_mean"],
        np.mean([y.mean(axis=(0, 1, 2)) for y in outputs], axis=0),
        rtol=1e-4,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        measured["tiny/stem_bn/moving_variance"],
        np.mean([y.var(axis=(0, 1, 2)) for y in outputs], axis=0),
        rtol=1e-4,
        atol=1e-5,
    )
    for name in averaged:
        if name.split("/")[-1] not in STATISTICS:
            np.testing.assert_allclose(measured[name], averaged[name], rtol=1e-6, err_msg=name)
    bn_stats = [name for name in measured if name.split("/")[-1] in STATISTICS]
    assert len(bn_stats) == 6
    assert all(not np.allclose(measured[name], averaged[name]) for name in bn_stats)


@pytest.fixture(scope="module")
def held_out_run(tmp_path_factory):
    """A tiny run with a held-out split and 3 checkpoints (steps 2, 4, 6)."""
    from resnet_app.engine import loop

    root = tmp_path_factory.mktemp("held_out")
    resolved = runs.small_config(
        root, "data.validation_split=16", train_steps=6, eval_every=2, keep_checkpoints=3
    )
    loop.train_and_evaluate(resolved, str(root / "run"))
    return root / "run"


def test_a_greedy_soup_is_never_worse_than_its_best_checkpoint(held_out_run):
    request = soup.AverageRequest(mode="soup", bn_batches=0, batch_size=8)
    record = soup.average_run(str(held_out_run), request)
    scores = record["scores"]
    assert sorted(scores) == ["ckpt-2", "ckpt-4", "ckpt-6"]
    assert record["evaluation"]["split"] == "holdout"
    # The best checkpoint alone starts the soup, and a member joins only if the
    # soup does not get worse: the soup scores at least as well as it.
    assert record["members"][0] == max(scores, key=scores.get)
    assert record["evaluation"]["top1"] >= max(scores.values())
    assert record["step"] == max(int(name.split("-")[1]) for name in record["members"])
    kept = json.loads((held_out_run / "averaged" / "averaged.json").read_text())
    assert kept["members"] == record["members"] and kept["mode"] == "soup"
    assert checkpoint.select(str(held_out_run), "averaged")[0][0] == record["step"]


def test_best_k_are_the_trainers_best_evaluations_on_the_held_out_split(held_out_run):
    with open(held_out_run / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f]
    trainer = [r for r in lines if r.get("split") == "holdout" and "checkpoint" not in r]
    holdout = {r["step"]: r["top1"] for r in trainer}
    assert set(holdout) >= {2, 4, 6}
    # Ties go to the earlier checkpoint.
    best_two = sorted(sorted((2, 4, 6), key=lambda step: -holdout[step])[:2])
    request = soup.AverageRequest(best=2, bn_batches=0, batch_size=8)
    record = soup.average_run(str(held_out_run), request)
    assert record["members"] == [f"ckpt-{step}" for step in best_two]


def test_best_k_refuses_to_rank_on_the_test_split(copied_run):
    _, model_dir = copied_run
    with pytest.raises(ConfigError, match="--best ranks the checkpoints by their evaluation on"):
        soup.average_run(str(model_dir), soup.AverageRequest(best=1, bn_batches=0))
    with pytest.raises(ConfigError, match="give --last or --best, not both"):
        soup.AverageRequest(best=1, last=2)


def test_a_soup_refuses_to_choose_on_the_test_split(held_out_run):
    request = soup.AverageRequest(mode="soup", split="test", bn_batches=0)
    with pytest.raises(ConfigError, match="which is tuning on test"):
        soup.average_run(str(held_out_run), request)


def test_the_greedy_rule_against_a_closed_form():
    # Ingredients are numbers, a soup's score the closeness of their mean to 3.
    def score(members):
        return -((np.mean(members) - 3.0) ** 2)

    ranked = sorted([3.3, 2.8, 3.5, 2.0], key=lambda x: score([x]), reverse=True)
    assert ranked == [2.8, 3.3, 3.5, 2.0]
    # 2.8 alone: -0.04; with 3.3 (mean 3.05): -0.0025, joins; with 3.5 (mean 3.2):
    # -0.04, stays out; with 2.0 (mean 2.7): -0.09, stays out.
    members, best = soup.greedy_soup(ranked, score)
    assert members == [2.8, 3.3] and best == pytest.approx(-0.0025)
    loss_members, loss = soup.greedy_soup(ranked, lambda m: -score(m), higher_is_better=False)
    assert loss_members == members and loss == pytest.approx(0.0025)


def test_mean_weights_is_the_float64_mean_in_each_dtype():
    rng = np.random.default_rng(0)
    sets = [[rng.normal(size=(3, 2)).astype(np.float32), np.float32(i)] for i in range(3)]
    mean = soup.mean_weights(sets)
    np.testing.assert_allclose(mean[0], np.mean([s[0] for s in sets], axis=0), rtol=1e-6)
    assert mean[1] == 1.0 and mean[0].dtype == np.float32


def test_the_averaged_checkpoint_is_replaced_whole(tmp_path):
    def save(value):
        def write(prefix):
            with open(prefix + ".index", "w") as f:
                f.write(value)

        return write

    prefix = averaged_checkpoint.write(str(tmp_path), 5, save("old"), {"mode": "uniform"})
    assert averaged_checkpoint.find(str(tmp_path)) == (5, prefix)

    def failing(prefix):
        save("half")(prefix)
        raise OSError("disk full")

    with pytest.raises(OSError):
        averaged_checkpoint.write(str(tmp_path), 9, failing, {})
    assert averaged_checkpoint.find(str(tmp_path)) == (5, prefix)  # The old one, whole.
    with open(prefix + ".index") as f:
        assert f.read() == "old"
    assert sorted(os.listdir(tmp_path)) == ["averaged"]  # Nothing half-written left.
    (tmp_path / "averaged" / "averaged.json").write_text("{")
    with pytest.raises(ConfigError, match=r"averaged.json is damaged .* run resnet-app average"):
        averaged_checkpoint.find(str(tmp_path))


def test_a_run_without_an_average_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="has no averaged checkpoint .* resnet-app average"):
        averaged_checkpoint.find(str(tmp_path))


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give --model_dir"),
        (["--model_dir=/no/such/run"], "--model_dir=/no/such/run is not a directory"),
        (["--model_dir={run}", "--last=0"], "--last must be a whole number >= 1, got 0"),
        (["--model_dir={run}", "--bn_batches=-1"], "--bn_batches must be a whole number >= 0"),
        (["--model_dir={run}", "--mode=mean"], "--mode"),
        (["--model_dir={run}", "--mode=soup", "--bn_batches=0"], "which is tuning on test"),
    ],
)
def test_mistakes_are_one_line(copied_run, args, message):
    _, model_dir = copied_run
    args = [arg.format(run=model_dir) for arg in args]
    line = error_line(run_command("resnet_app.tools.average", *args))
    assert message in line
