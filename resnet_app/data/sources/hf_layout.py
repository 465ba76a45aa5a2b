"""Where a Hugging Face dataset's files are, and the features declared beside them.

Two layouts: `Dataset(Dict).save_to_disk`'s (`dataset_dict.json`, each split's Arrow files
named in its `state.json`, features in `dataset_info.json`) and a Hub repository's: the
files a README's `configs:` names, else every Parquet file under `data/` (or the directory),
its split found as `datasets` finds it, by a keyword in its path ("train", "valid",
"test", ...: `SPLIT_KEYWORDS`), all "train" when none has one. A repository of several
configs is read one config at a time: `hf:DIR/CONFIG`. Features come from the README's YAML
here, in `datasets`' JSON form; the files' own schema metadata, when present, wins later.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

from resnet_app.common.errors import ConfigError
from resnet_app.data.sources.registry import register_check

PREFIX = "hf:"
SPLIT_KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
_SPLIT_OF = {word: split for split, words in SPLIT_KEYWORDS.items() for word in words}
DATA_FILES = (".parquet", ".arrow")


@dataclasses.dataclass(frozen=True)
class Layout:
    """A dataset's files by split (sorted) and the features declared beside them, if any."""

    splits: dict[str, list[str]]
    features: dict | None


def split_of(path: str) -> str | None:
    """The split a path's first keyword names ("data/valid-0000.parquet": "validation")."""
    for word in re.split(r"[-._ /\\0-9]+", path.lower()):
        if word in _SPLIT_OF:
            return _SPLIT_OF[word]
    return None


def _front_matter(path: str) -> dict:
    """A README's YAML header ({} when it has none)."""
    import yaml

    with open(path, encoding="utf-8") as file:
        text = file.read()
    if not text.startswith("---"):
        return {}
    try:
        header = yaml.safe_load(text[3 : text.find("\n---", 3)])
    except yaml.YAMLError as error:
        line = str(error).splitlines()[0]
        raise ConfigError(f"{path}: its YAML header cannot be read ({line})") from None
    return header if isinstance(header, dict) else {}


def _yaml_type(value) -> dict:
    """A README feature's type ("image", {"class_label": ...}) as `datasets` writes it in JSON."""
    if value == "image":
        return {"_type": "Image"}
    if isinstance(value, dict) and "class_label" in value:
        names = (value["class_label"] or {}).get("names") or []
        if isinstance(names, dict):
            names = [names[key] for key in sorted(names, key=int)]
        return {"_type": "ClassLabel", "names": [str(name) for name in names] or None}
    return {"_type": str(value)}


def _feature(entry: dict) -> dict:
    for key in ("list", "sequence", "large_list"):
        if key in entry:
            return {"_type": "List", "feature": _yaml_type(entry[key])}
    return _yaml_type(entry.get("dtype"))


def _several_configs(root: str, configs: list[str]) -> ConfigError:
    return ConfigError(
        f"--dataset={PREFIX}{root} has configs {', '.join(configs)}: pass "
        f"--dataset={PREFIX}{os.path.join(root, '<config>')}"
    )


def _pick(entries, config: str | None, root: str) -> dict | None:
    """The entry of `entries` (configs or dataset_infos, each maybe with `config_name`) that
    `config` names, else the default or only one; refuses a choice it cannot make."""
    entries = [entries] if isinstance(entries, dict) else list(entries or [])
    named = {entry.get("config_name", "default"): entry for entry in entries}
    if config is not None or not entries:
        return named.get(config or "default")
    defaults = [entry for entry in entries if entry.get("default")] or [named.get("default")]
    if len(named) == 1 or defaults[0] is not None:
        return defaults[0] or entries[0]
    raise _several_configs(root, list(named))


def _data_files(root: str) -> dict[str, list[str]]:
    """{split: Parquet files} under `root/data` or `root`, split by keyword; a single config
    directory is entered."""
    base = os.path.join(root, "data") if os.path.isdir(os.path.join(root, "data")) else root
    found = sorted(glob.glob(os.path.join(base, "**", "*.parquet"), recursive=True))
    relative = [os.path.relpath(path, base) for path in found]
    relative = [path for path in relative if not path.startswith(".") and "/." not in path]
    tops = {path.split(os.sep)[0] for path in relative if os.sep in path}
    configs = sorted(top for top in tops if split_of(top) is None)
    if len(configs) > 1:
        raise _several_configs(root, configs)
    if configs and tops == set(configs) and all(os.sep in path for path in relative):
        return _data_files(os.path.join(base, configs[0]))
    splits: dict[str, list[str]] = {}
    keyed = any(split_of(path) for path in relative)
    for path in relative:
        other = re.split(r"[-._/]", path, maxsplit=1)[0]
        splits.setdefault((split_of(path) or other) if keyed else "train", []).append(path)
    return {split: [os.path.join(base, p) for p in paths] for split, paths in splits.items()}


def _readme_layout(root: str) -> Layout:
    """The files a README's `configs:` names (`data_files`, `data_dir`), else `_data_files`."""
    header, directory, config = {}, root, None
    for place, name in ((root, None), (os.path.dirname(root), os.path.basename(root))):
        if os.path.isfile(os.path.join(place, "README.md")):
            header = _front_matter(os.path.join(place, "README.md"))
            directory, config = place, name
            break
    chosen = _pick(header.get("configs"), config, root)
    config = chosen.get("config_name", "default") if chosen else config
    info = _pick(header.get("dataset_info"), config, root) or {}
    entries = info.get("features") if isinstance(info.get("features"), list) else None
    features = {e["name"]: _feature(e) for e in entries if "name" in e} if entries else None
    if chosen is None or not (chosen.get("data_files") or chosen.get("data_dir")):
        return Layout(_data_files(root), features)
    if not chosen.get("data_files"):
        return Layout(_data_files(os.path.join(directory, chosen["data_dir"])), features)
    data_files = chosen["data_files"]
    if not isinstance(data_files, list) or not all(isinstance(e, dict) for e in data_files):
        data_files = [{"split": "train", "path": data_files}]
    base = os.path.join(directory, chosen.get("data_dir") or "")
    splits = {}
    for entry in data_files:
        patterns = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
        paths = {
            p
            for pattern in patterns
            for p in glob.glob(os.path.join(base, pattern), recursive=True)
        }
        name = entry.get("split", "train")
        found = sorted(p for p in paths if p.endswith(DATA_FILES))
        if not found:
            raise ConfigError(
                f"--dataset={PREFIX}{root}: the README's config {config!r} names no Parquet or "
                f"Arrow files for split {name!r} ({', '.join(patterns)})"
            )
        splits[split_of(name) or name] = found
    return Layout(splits, features)


def _saved(directory: str) -> tuple[list[str], dict | None]:
    """A `save_to_disk` split's Arrow files and the features of its dataset_info.json."""
    with open(os.path.join(directory, "state.json"), encoding="utf-8") as file:
        state = json.load(file)
    files = [os.path.join(directory, entry["filename"]) for entry in state["_data_files"]]
    info_path = os.path.join(directory, "dataset_info.json")
    if not os.path.isfile(info_path):
        return files, None
    with open(info_path, encoding="utf-8") as file:
        return files, json.load(file).get("features")


def _saved_layout(root: str) -> Layout:
    """The splits `Dataset(Dict).save_to_disk` wrote in `root`."""
    try:
        if not os.path.isfile(os.path.join(root, "dataset_dict.json")):
            files, features = _saved(root)
            return Layout({"train": files}, features)
        with open(os.path.join(root, "dataset_dict.json"), encoding="utf-8") as file:
            names = json.load(file)["splits"]
        saved = {name: _saved(os.path.join(root, name)) for name in names}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"--dataset={PREFIX}{root}: its save_to_disk files cannot be read ({error}); write "
            "them again with Dataset.save_to_disk"
        ) from None
    features = next((features for _, features in saved.values() if features), None)
    splits = {split_of(name) or name: files for name, (files, _) in saved.items()}
    return Layout(splits, features)


@register_check("hf")
def check(root: str, config=None) -> Layout:
    """The dataset's files by split, found without reading them; refuses a directory that
    holds neither layout, a loading script alone, or no training split."""
    name = PREFIX + root
    if not os.path.isdir(root):
        raise ConfigError(f"--dataset={name}: {root} is not a directory")
    saved = ("dataset_dict.json", "state.json")
    if any(os.path.isfile(os.path.join(root, file)) for file in saved):
        layout = _saved_layout(root)
    else:
        layout = _readme_layout(root)
    scripts = glob.glob(os.path.join(root, "*.py"))
    if not any(layout.splits.values()) and scripts:
        raise ConfigError(
            f"--dataset={name}: {root} holds a loading script ({os.path.basename(scripts[0])}) "
            "that fetches its data from the network; where there is network, run "
            "datasets.load_dataset(...).save_to_disk(DIR) and pass --dataset=hf:DIR"
        )
    if not layout.splits.get("train"):
        found = ", ".join(layout.splits) or "no Parquet files and no save_to_disk output"
        raise ConfigError(
            f"--dataset={name}: {root} has {found}; expected a train split: "
            "data/train-*.parquet (the Hub's layout) or Dataset(Dict).save_to_disk's"
        )
    return layout
