"""The console progress line: its bar, percentage and ETA (the clock is faked)."""

import io

from resnet_app import metrics


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
