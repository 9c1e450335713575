"""A small renderer for this project's kustomizations, for machines without a recent kubectl.

Debian's kubernetes-client (1.20) embeds a kustomize too old for `patches:` and `components:`, so the
deploy tests render with `kubectl kustomize` when a recent one is installed and with this otherwise.
It implements the subset deploy/ uses: `resources` (files and directories), `components`, and
`patches` (from a file or inline; JSON 6902 lists with a `target`, or strategic-merge documents
merged as plain maps). tests/deploy/test_deploy.py checks that it renders exactly what kubectl renders.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["build"]

Doc = dict[str, Any]


def _load_all(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json6902(doc: Doc, ops: list[dict[str, Any]]) -> None:
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        kind = op["op"]
        if isinstance(node, list):
            if kind == "add":
                node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
            elif kind == "replace":
                node[int(last)] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del node[int(last)]
            else:
                raise ValueError(f"unsupported op {kind!r}")
        elif kind in ("add", "replace"):
            if kind == "replace" and last not in node:
                raise KeyError(f"replace of a missing path {op['path']!r}")
            node[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del node[last]
        else:
            raise ValueError(f"unsupported op {kind!r}")


def _merge(base: Doc, patch: Doc) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def _matches(doc: Doc, target: dict[str, str]) -> bool:
    return all(
        (doc.get("kind") if key == "kind" else doc.get("metadata", {}).get(key)) == value
        for key, value in target.items()
        if key in ("kind", "name", "namespace")
    )


def _patch(root: Path, kustomization: Doc, docs: list[Doc]) -> None:
    for entry in kustomization.get("patches", []):
        text = (root / entry["path"]).read_text(encoding="utf-8") if "path" in entry else entry["patch"]
        content = yaml.safe_load(text)
        if isinstance(content, list):
            targets = [d for d in docs if _matches(d, entry["target"])]
            if not targets:
                raise ValueError(f"patch target {entry['target']} matches nothing")
            for doc in targets:
                _json6902(doc, content)
        else:
            target = {"kind": content["kind"], "name": content["metadata"]["name"]}
            found = [d for d in docs if _matches(d, target)]
            if len(found) != 1:
                raise ValueError(f"strategic-merge patch for {target} matches {len(found)} resources")
            _merge(found[0], content)


def build(root: str | Path) -> list[Doc]:
    """The resources a kustomization directory renders to."""
    root = Path(root)
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    docs: list[Doc] = []
    for resource in kustomization.get("resources", []):
        path = (root / resource).resolve()
        docs.extend(build(path) if path.is_dir() else _load_all(path))
    for component in kustomization.get("components", []):
        path = (root / component).resolve()
        _patch(path, yaml.safe_load((path / "kustomization.yaml").read_text(encoding="utf-8")), docs)
    _patch(root, kustomization, docs)
    return docs
