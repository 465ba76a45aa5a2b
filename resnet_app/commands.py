"""`resnet-app COMMAND [FLAGS]`: every command of the app behind one name.

    resnet-app train --config=shapes_quickstart
    resnet-app model --model=resnet50

Each command is a module (`python -m MODULE`) run as the main program, named
`resnet-app COMMAND` in --help and errors.
"""

from __future__ import annotations

import ast
import importlib.util
import runpy
import sys
from typing import NamedTuple, NoReturn


class Command(NamedTuple):
    module: str
    summary: str


COMMANDS = {
    "train": Command("resnet_app.train", "train and evaluate a ResNet (resumes a run directory)"),
    "evaluate": Command("resnet_app.evaluate", "evaluate a run's checkpoints: reports, TTA"),
    "report": Command("resnet_app.report", "one HTML page of what a checkpoint learned"),
    "export": Command("resnet_app.export", "export a run: SavedModel, TFLite, ONNX, parity"),
    "average": Command("resnet_app.tools.average", "average a run's checkpoints (uniform, soup)"),
    "sweep": Command("resnet_app.tools.sweep", "search settings (Optuna), each trial a run"),
    "predict": Command("resnet_app.predict", "classify image files with a run or an export"),
    "model": Command("resnet_app.tools.model_summary", "a model's layers, parameters and MACs"),
    "launch": Command("resnet_app.launch", "N local workers of one run, restarted on failure"),
    "lr-find": Command("resnet_app.tools.lr_find", "the learning-rate range test"),
    "schedule": Command("resnet_app.tools.lr_schedule", "print a config's LR schedule"),
    "plot": Command("resnet_app.tools.plot_metrics", "draw runs' curves from metrics.jsonl"),
    "show-batch": Command("resnet_app.tools.show_batch", "save a picture of a training batch"),
}
PROGRAM = "resnet-app"


def usage() -> str:
    """The command list that `resnet-app` and `resnet-app --help` print."""
    width = max(len(name) for name in COMMANDS)
    rows = [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    return "\n".join(
        [
            f"usage: {PROGRAM} COMMAND [FLAGS]   ({PROGRAM} COMMAND --help lists its flags)",
            "",
            "commands:",
            *rows,
        ]
    )


def _docstring(module: str) -> str | None:
    """`module`'s docstring, read from its source without running it."""
    spec = importlib.util.find_spec(module)
    if spec.submodule_search_locations is not None:  # A package runs its __main__.
        spec = importlib.util.find_spec(f"{module}.__main__")
    with open(spec.origin, encoding="utf-8") as source:
        return ast.get_docstring(ast.parse(source.read()))


def main(argv: list[str] | None = None) -> NoReturn:
    """Runs the command `argv[1]` names with the rest of `argv`; never returns."""
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        sys.stdout.write(usage() + "\n")
        sys.exit(0 if len(argv) >= 2 else 2)
    name = argv[1]
    if name not in COMMANDS:
        sys.stderr.write(
            f"error: unknown command {name!r}; the commands are {', '.join(COMMANDS)} "
            f"(run {PROGRAM} --help)\n"
        )
        sys.exit(2)
    module = COMMANDS[name].module
    sys.argv = [f"{PROGRAM} {name}", *argv[2:]]
    # absl's --help opens with the main module's docstring: the command's, not ours.
    sys.modules["__main__"].__doc__ = _docstring(module)
    runpy.run_module(module, run_name="__main__", alter_sys=False)
    sys.exit(0)
