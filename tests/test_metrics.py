"""The console progress line: its bar, percentage and ETA (the clock is faked)."""

import io
import json
import math
import os

import numpy as np
import pytest

from resnet_app.common import metrics
from resnet_app.evaluation import reports


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_format_duration():
    assert metrics.format_duration(3723) == "1:02:03"
    assert metrics.format_duration(125) == "2:05"
    assert metrics.format_duration(float("inf")) == "?"


def test_progress_bar_and_eta(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    terminal = FakeTerminal()
    progress = metrics.Progress(total_steps=400, start_step=100, stream=terminal)
    clock[0] = 130.0  # 100 steps in 30 s: 200 steps left take 60 s.
    progress.update(200, "loss 1.0")
    assert progress.eta(200) == 60.0
    line = terminal.getvalue()
    assert line.startswith("\r\033[K[============>")
    assert "200/400 50% loss 1.0 ETA 1:00" in line
    progress.finish()
    assert terminal.getvalue().endswith("\n")
    # Not a terminal: nothing is drawn (the log lines carry the progress).
    quiet = io.StringIO()
    metrics.Progress(10, stream=quiet).update(5, "x")
    assert quiet.getvalue() == ""


def test_a_record_cut_off_by_a_kill_does_not_swallow_the_next(tmp_path):
    (tmp_path / metrics.METRICS_FILE).write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write({"step": 0, "event": "start"})
    writer.close()
    lines = (tmp_path / metrics.METRICS_FILE).read_text().splitlines()
    assert lines == ['{"step": 1, "loss": 2.0}', '{"step": 2, "lo', '{"step": 0, "event": "start"}']
    writer = metrics.MetricsWriter(str(tmp_path))  # A whole last line gains no blank line.
    writer.write({"step": 3})
    writer.close()
    assert (tmp_path / metrics.METRICS_FILE).read_text().splitlines()[3:] == ['{"step": 3}']


def test_non_finite_numbers_are_written_as_strict_json_null(tmp_path):
    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name}"))

    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write({"step": 7, "loss": math.nan, "rates": [math.inf, 0.5], "x": {"y": -math.inf}})
    writer.close()
    line = (tmp_path / metrics.METRICS_FILE).read_text()
    assert strict(line) == {"step": 7, "loss": None, "rates": [None, 0.5], "x": {"y": None}}
    report = reports.build_report(
        {
            "checkpoint": "ckpt-1",
            "step": 1,
            "split": "test",
            "top1": 0.0,
            "top5": 0.0,
            "loss": math.nan,
            "num_examples": 2,
        },
        np.array([[0, 1], [0, 1]]),
        ["a", "b"],
    )
    parsed = strict(reports.to_json(report))
    assert parsed["loss"] is None and parsed["classes"][0]["accuracy"] == 0.0


def test_a_symlinked_metrics_file_is_refused_and_its_target_untouched(tmp_path):
    from resnet_app.common.errors import ConfigError

    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    os.symlink(target, tmp_path / "metrics.jsonl")
    with pytest.raises(ConfigError, match=r"metrics.jsonl is a symbolic link"):
        metrics.MetricsWriter(str(tmp_path))
    assert target.read_text() == "mine\n"
