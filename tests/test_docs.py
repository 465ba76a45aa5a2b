"""The documentation stays true: the generated config reference, links, commands and recipes."""

import glob
import os
import re

import pytest

from resnet_app import commands
from resnet_app.config import recipes, reference
from tests.commands import REPO

PAGES = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
FRONT = [os.path.join(REPO, name) for name in ("README.md", "BUILD.md")]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    anchors = set()
    for line in _text(path).splitlines():
        if line.startswith("#") and not line.startswith("#!"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_the_config_reference_is_not_stale():
    written = _text(os.path.join(REPO, "docs", "config.md"))
    assert written == reference.markdown(), (
        "docs/config.md is stale: run python -m resnet_app.config.reference --out=docs/config.md"
    )


def test_every_key_is_explained():
    rows = [line for line in reference.markdown().splitlines() if line.startswith("| `")]
    assert len(rows) > 150
    assert not [row for row in rows if row.rstrip().endswith("|  |")]


def test_the_readme_is_a_front_page():
    readme = _text(os.path.join(REPO, "README.md"))
    assert len(readme.splitlines()) <= 200
    for page in PAGES:
        assert f"docs/{os.path.basename(page)}" in readme, f"README has no link to {page}"


@pytest.mark.parametrize("path", FRONT + PAGES, ids=os.path.basename)
def test_links_lead_somewhere(path):
    for target in LINK.findall(_text(path)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        assert os.path.exists(linked), f"{path}: {target} does not exist"
        if anchor:
            assert anchor in _anchors(linked), f"{path}: no heading for #{anchor} in {linked}"


@pytest.mark.parametrize("path", FRONT + PAGES, ids=os.path.basename)
def test_commands_and_recipes_named_exist(path):
    text = _text(path)
    for name in re.findall(r"resnet-app ([a-z][\w-]*)", text):
        assert name in commands.COMMANDS, f"{path}: resnet-app {name} is no command"
    for name in re.findall(r"--config=([\w.-]+)(?=[\s`)])", text):
        if "/" not in name and name != "NAME" and name.strip("."):
            assert name.removesuffix(".yaml") in recipes.names(), f"{path}: no recipe {name}"


def _expand_braces(text):
    """`a{1,2}b` -> `a1b a2b`, as docs write families of recipes."""
    pattern = re.compile(r"([\w.]*)\{([\w,]+)\}([\w.]*)")
    return pattern.sub(lambda m: " ".join(m[1] + x + m[3] for x in m[2].split(",")), text)


def test_every_recipe_is_documented():
    guide = _expand_braces("".join(_text(page) for page in PAGES))
    for name in recipes.names():
        assert name in guide, f"recipe {name} appears in no page of docs/"
