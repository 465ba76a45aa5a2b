"""Knowledge distillation (`train.teacher`, `engine/teacher.py`, `engine/losses/distillation.py`).

The loss against Hinton et al.'s formula in NumPy; the teacher's logits against its
run's serving model; a distillation that weighs nothing against no teacher, bitwise;
two towers against one; a kill -9 against the uninterrupted run, bitwise, with the
teacher's source gone before the resume.
"""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.data import run_pipeline
from resnet_app.engine import loop, setup
from resnet_app.engine import teacher as teacher_lib
from resnet_app.engine.losses import Loss, create_loss
from resnet_app.engine.losses.cross_entropy import CrossEntropy
from resnet_app.engine.losses.distillation import Distillation
from resnet_app.engine.step import Tower
from resnet_app.export import savedmodel
from tests import runs
from tests.test_losses import numpy_bce, numpy_cross_entropy


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def numpy_distillation(student, teacher, labels, mask, alpha, temperature, smoothing=0.0):
    """Hinton et al. (2015): (1 - a) CE(labels) + a T^2 KL(p_teacher^T || p_student^T), summed;
    for multi-label data the BCE of the sigmoids (`test_losses.py`'s NumPy losses)."""
    student, teacher = student.astype(np.float64), teacher.astype(np.float64)
    classes = student.shape[-1]
    hot = labels if labels.ndim == 2 else np.eye(classes)[labels]
    targets = hot * (1 - smoothing) + smoothing / classes
    scaled, teaching = student / temperature, teacher / temperature
    if labels.ndim == 2:  # Multi-label: BCE of sigmoids, averaged over the classes.
        hard = numpy_bce(student, targets)
        soft = numpy_bce(scaled, _sigmoid(teaching))
    else:  # KL(p || q) = CE(p, q) - CE(p, p).
        hard = numpy_cross_entropy(student, targets)
        p = _softmax(teaching)
        soft = numpy_cross_entropy(scaled, p) - numpy_cross_entropy(teaching, p)
    per_example = (1 - alpha) * hard + alpha * temperature**2 * soft
    return float((mask * per_example).sum())


def distilled(teacher_logits, temperature, alpha):
    """The distillation term of a teacher whose logits are `teacher_logits`."""
    return Distillation(lambda images: tf.constant(teacher_logits), temperature, alpha)


@pytest.mark.parametrize(
    "multi_label,alpha,temperature,smoothing",
    [(False, 0.9, 4.0, 0.0), (False, 0.3, 1.0, 0.1), (True, 0.5, 2.0, 0.0)],
)
def test_the_loss_is_hintons_distillation_against_numpy(multi_label, alpha, temperature, smoothing):
    rng = np.random.default_rng(7)
    student = rng.normal(size=(12, 5)).astype(np.float32) * 3
    teacher = rng.normal(size=(12, 5)).astype(np.float32) * 3
    mask = np.array([1.0] * 10 + [0.0] * 2, np.float32)  # A padded batch's last two.
    if multi_label:
        labels = (rng.random((12, 5)) < 0.4).astype(np.float32)
    else:
        labels = rng.integers(0, 5, 12).astype(np.int32)
    terms = (CrossEntropy(smoothing, weight=1 - alpha), distilled(teacher, temperature, alpha))
    batch = {"label": labels, "mask": mask, "image": np.zeros(12, np.float32)}
    total = Loss(terms)(tf.constant(student), {k: tf.constant(v) for k, v in batch.items()})["loss"]
    expected = numpy_distillation(student, teacher, labels, mask, alpha, temperature, smoothing)
    np.testing.assert_allclose(float(total), expected, rtol=2e-6)


def test_a_student_equal_to_its_teacher_has_no_soft_loss():
    """KL(p || p) = 0: with alpha 1, a student whose logits are the teacher's costs nothing."""
    logits = np.random.default_rng(3).normal(size=(6, 4)).astype(np.float32)
    batch = {"label": tf.zeros(6, tf.int32), "mask": tf.ones(6), "image": tf.zeros(6)}
    loss = Loss((CrossEntropy(weight=0.0), distilled(logits, 3.0, 1.0)))
    total = loss(tf.constant(logits), batch)["loss"]
    assert abs(float(total)) < 1e-5


def _teacher_run(root):
    resolved = runs.small_config(root, train_steps=8, eval_every=8)
    model_dir = root / "teacher"
    loop.train_and_evaluate(resolved, str(model_dir))
    return model_dir


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return _teacher_run(tmp_path_factory.mktemp("distill"))


def _student(tmp_path, teacher, *sets, **train):
    return runs.small_config(tmp_path, f"train.teacher={teacher}", *sets, **train)


def test_the_teacher_sees_each_image_as_its_own_run_serves_it(teacher_dir, tmp_path):
    """Images normalized by the student's own (other) statistics reach the teacher as its
    run's serving model sees their pixels: the logits agree, and an export of the run
    as the teacher gives them too."""
    served, source = savedmodel.load(str(teacher_dir))
    pixels = np.random.default_rng(1).integers(0, 256, (6, 32, 32, 3)).astype(np.uint8)
    expected = served.serve_images(tf.constant(pixels))["logits"].numpy()
    export_dir = str(tmp_path / "export")
    savedmodel.save(served, source, export_dir)
    mean, std = [90.0, 100.0, 110.0], [50.0, 60.0, 70.0]  # Not the teacher's.
    for teacher in (teacher_dir, export_dir):
        resolved = _student(tmp_path, teacher, f"data.mean={mean}", f"data.std={std}")
        run = setup.build_run(resolved, str(tmp_path / f"run_{os.path.basename(teacher)}"))
        try:
            images = (pixels.astype(np.float32) - np.float32(mean)) / np.float32(std)
            logits = run.teacher(tf.constant(images)).numpy()
        finally:
            run.close()
        np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4, err_msg=teacher)


def test_the_towers_loss_distills_the_teacher_of_the_same_images(teacher_dir, tmp_path):
    resolved = _student(tmp_path, teacher_dir, "train.distill_alpha=0.7")
    run = setup.build_run(resolved, str(tmp_path / "run"))
    try:
        tower = Tower(run.model, run.optimizer, create_loss(resolved, teacher=run.teacher))
        rng = np.random.default_rng(2)
        images = tf.constant(rng.normal(size=(8, 32, 32, 3)).astype(np.float32))
        labels = rng.integers(0, run.pipeline.num_classes, 8).astype(np.int32)
        batch = {"image": images, "label": tf.constant(labels), "mask": tf.ones(8)}
        loss_sum = tower(batch, tf.constant(8.0), 1)[1]["loss"]
        # Training mode normalizes by the batch's statistics: a second call gives the same.
        student = run.model(images, training=True).numpy()
        teacher = run.teacher(images).numpy()
    finally:
        run.close()
    expected = numpy_distillation(student, teacher, labels, np.ones(8), 0.7, 4.0)
    np.testing.assert_allclose(float(loss_sum), expected, rtol=1e-5)


def _final_weights(resolved, model_dir):
    return loop.train_and_evaluate(resolved, model_dir).model.get_weights()


@pytest.mark.usefixtures("op_determinism_off_after")
def test_a_distillation_that_weighs_nothing_trains_bitwise_as_no_teacher(teacher_dir, tmp_path):
    sets = ["train.deterministic=true", "train.eval_every=100"]
    plain = _final_weights(
        runs.small_config(tmp_path, *sets, train_steps=3), str(tmp_path / "plain")
    )
    resolved = _student(tmp_path, teacher_dir, "train.distill_alpha=0", *sets, train_steps=3)
    zero = _final_weights(resolved, str(tmp_path / "zero"))
    resolved = _student(tmp_path, teacher_dir, "train.distill_alpha=0.9", *sets, train_steps=3)
    distilled = _final_weights(resolved, str(tmp_path / "distilled"))
    for a, b in zip(plain, zero, strict=True):
        np.testing.assert_array_equal(b, a)
    assert any(not np.array_equal(a, b) for a, b in zip(plain, distilled))
    info = json.loads((tmp_path / "zero" / "teacher" / "teacher.json").read_text())
    assert info["kind"] == teacher_lib.NETWORK and info["model_name"] == "tiny"
    records = runs.read_records(str(tmp_path / "zero"))
    (cost,) = [r for r in records if r.get("event") == "teacher"]
    assert cost["forward_seconds"] > 0


def test_two_towers_distill_like_one(teacher_dir, tmp_path):
    """With synchronized BatchNorm the student on 2 towers, each with the teacher's
    replica, follows the 1-tower run (as test_train's check without a teacher)."""
    weights = []
    for towers in (1, 2):
        resolved = _student(
            tmp_path,
            teacher_dir,
            "model.bn_synchronized=true",
            "train.eval_every=100",
            f"train.num_towers={towers}",
            train_steps=3,
        )
        weights.append(_final_weights(resolved, str(tmp_path / f"run{towers}")))
    for one, two in zip(*weights):
        np.testing.assert_allclose(two, one, rtol=1e-3, atol=2e-5)


def test_a_kill_mid_epoch_resumes_bitwise_from_the_runs_copy_of_its_teacher(teacher_dir, tmp_path):
    from tests.test_checkpoint import SMALL, drive

    source = tmp_path / "source"
    shutil.copytree(teacher_dir, source)
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--train_steps=14", "--deterministic"]
    args += ["--set=train.checkpoint_every=5", f"--set=train.teacher={source}"]
    whole = drive(*args, f"--model_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    kill_at = runs.fault_rng().randint(6, 9)
    killed = drive(*args, f"--model_dir={tmp_path / 'run'}", kill_at=kill_at)
    assert killed.returncode == -9, killed.stderr[-3000:]
    shutil.rmtree(source)  # The source is gone: the resumed run reads its own copy.
    resumed = drive(*args, f"--model_dir={tmp_path / 'run'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resumed from step 5 (epoch 1, example 16 of 64)" in resumed.stderr
    assert "read from the run's copy" in resumed.stderr
    runs.assert_same_checkpoints(
        tmp_path / "whole" / "ckpt-14", tmp_path / "run" / "ckpt-14", f"(killed at {kill_at})"
    )


def test_a_teacher_of_other_classes_is_refused(teacher_dir, tmp_path):
    classes = len(json.loads((teacher_dir / "data_info.json").read_text())["class_names"])
    for count, match in [(classes + 1, f"has {classes} classes and the data {classes + 1}")]:
        resolved = _student(
            tmp_path, teacher_dir, "data.dataset=synthetic", f"data.num_classes={count}"
        )
        with pytest.raises(ConfigError, match=match):
            setup.build_run(resolved, str(tmp_path / f"run{count}"))
    resolved = _student(
        tmp_path, teacher_dir, "data.dataset=synthetic", f"data.num_classes={classes}"
    )
    with pytest.raises(ConfigError, match="names class 0 .* where the data has"):
        setup.build_run(resolved, str(tmp_path / "named"))


def test_a_torchvision_file_teaches_with_its_own_preprocessing(tmp_path):
    """A torchvision ResNet-18 file as the teacher: on images normalized by the student's
    statistics, its logits are NumPy's forward of torchvision's definition on the pixels
    scaled as torchvision scales them (`torchvision_reference.py`)."""
    from safetensors.numpy import save_file

    from tests.torchvision_reference import forward, random_state_dict

    classes = len(run_pipeline.create_run_pipeline(runs.small_config(tmp_path)).class_names)
    state = random_state_dict("resnet18", classes, np.random.default_rng(4))
    save_file(state, str(tmp_path / "teacher.safetensors"))
    mean, std = [120.0], [60.0]
    resolved = _student(
        tmp_path,
        tmp_path / "teacher.safetensors",
        "train.teacher_model=resnet18",
        f"data.mean={mean * 3}",
        f"data.std={std * 3}",
    )
    run = setup.build_run(resolved, str(tmp_path / "run"))
    try:
        pixels = np.random.default_rng(5).uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
        logits = run.teacher(tf.constant((pixels - 120) / 60)).numpy()
    finally:
        run.close()
    scaled = (pixels / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    expected = forward(state, "resnet18", scaled.transpose(0, 3, 1, 2))
    assert np.abs(logits - expected).max() <= 1e-4 * np.abs(expected).max()


def test_a_weights_file_teacher_needs_its_network(tmp_path):
    weights = tmp_path / "teacher.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ConfigError, match="name its network with train.teacher_model"):
        setup.build_run(_student(tmp_path, weights), str(tmp_path / "run"))


def test_distillation_settings_without_a_teacher_are_refused():
    for assignment in ["train.distill_alpha=0.9", "train.teacher_model=resnet50"]:
        with pytest.raises(ConfigError, match="need train.teacher"):
            config.resolve(sets=[assignment])
    with pytest.raises(ConfigError, match="train.distill_temperature"):
        config.resolve(sets=["train.teacher=x", "train.distill_temperature=0"])
