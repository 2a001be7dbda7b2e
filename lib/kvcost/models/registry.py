"""The model registry: one cited record per model in ``data/models/`` (config subset, sources).

:func:`load_model` turns a record into a :class:`~kvcost.models.hfconfig.Geometry`; :func:`resolve`
also accepts a path to a ``config.json`` (or its folder) and tells a missing file from an
unknown name. Standard library only.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kvcost.models.hfconfig import Geometry, from_hf_config, parameter_counts
from kvcost.paths import data_path
from kvcost.provenance import DIGESTS_FILE, checked

__all__ = [
    "POST_MODELS",
    "answers",
    "check_models",
    "config_name",
    "list_models",
    "load_model",
    "model_record",
    "models_dir",
    "naive_geometry",
    "param_count",
    "resolve",
    "weight_dtype",
]

#: The five models of the post's Block 1, in its order.
POST_MODELS = ["Llama-3.1-8B", "Qwen3-8B", "Mistral-7B-v0.1", "gpt-oss-20b", "Llama-2-7B"]


def models_dir() -> Path:
    """Folder of the model records: ``$KVCOST_MODELS_DIR`` or ``data/models`` in the package data."""
    env = os.environ.get("KVCOST_MODELS_DIR")
    if env:
        return Path(env)
    return data_path("models")


_RECORDS: dict[str, dict[str, Any]] | None = None


def _records() -> dict[str, dict[str, Any]]:
    global _RECORDS
    if _RECORDS is None:
        recs: dict[str, dict[str, Any]] = {}
        folder = models_dir()
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            if path.name == DIGESTS_FILE:         # the folder's sha256 record, not a model
                continue
            rec = json.loads(checked(path).read_text(encoding="utf-8"))
            recs[rec["name"]] = rec
        _RECORDS = recs
    return _RECORDS


def list_models() -> list[str]:
    """Names of the models in ``data/models``, sorted case-insensitively."""
    return sorted(_records(), key=str.lower)


def model_record(name: str) -> dict[str, Any]:
    """The full record of a model (config subset, sources, notes); ValueError listing known names."""
    recs = _records()
    if isinstance(name, str):
        if name in recs:
            return recs[name]
        folded = {k.lower(): k for k in recs}
        if name.lower() in folded:
            return recs[folded[name.lower()]]
        by_repo = {str(r.get("hf_repo", "")).lower(): k for k, r in recs.items()}
        if name.lower() in by_repo:
            return recs[by_repo[name.lower()]]
    raise ValueError(f"unknown model {name!r}; known models: {list_models()}")


def check_models(param: str, names: Any, min_len: int = 1) -> list[str]:
    """Validate a notebook/CLI list of model names; returns their canonical names.

    Names match case-insensitively, and Hugging Face repo ids work too; anything else raises
    ValueError naming ``param`` and listing the known models.
    """
    if not isinstance(names, (list, tuple)) or len(names) < min_len or not all(isinstance(n, str) for n in names):
        raise ValueError(f"parameter {param!r} must be a list of at least {min_len} model name(s) "
                         f"from {list_models()}, got {names!r}")
    out = []
    for name in names:
        try:
            out.append(model_record(name)["name"])
        except ValueError:
            raise ValueError(f"parameter {param!r}: unknown model {name!r}; known models: {list_models()}") from None
    return out


def load_model(name: str) -> Geometry:
    """The :class:`Geometry` of a model in ``data/models`` (by name or Hugging Face repo id)."""
    rec = model_record(name)
    return from_hf_config(rec["config"], name=rec["name"])


def naive_geometry(name: str) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) as the post's Block 1 reads them from a model's config."""
    return load_model(name).naive


def config_name(path: str | os.PathLike[str]) -> str:
    """What a config path's model is called: the config's own ``_name_or_path`` (what transformers writes
    when it saves one), the ``owner/name`` of a Hugging Face cache folder (``models--owner--name/snapshots/
    <hash>/config.json``), else the path as given -- never a folder's name, which in a download cache is a
    commit hash."""
    path = Path(path)
    cfg = path / "config.json" if path.is_dir() else path
    try:
        own = json.loads(cfg.read_text(encoding="utf-8")).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        own = None
    if isinstance(own, str) and own.strip() and not Path(own).is_absolute():
        return own.strip()
    for part in cfg.resolve().parts:
        if part.startswith("models--") and part.count("--") >= 2:
            return "/".join(part.split("--")[1:])
    return str(path)


def resolve(target: str) -> Geometry:
    """A model's geometry from a registry name, a Hugging Face repo id listed there, or a config path.

    Errors say which it was taken for: "file not found" for a path that does not exist, "unknown
    model" (with the known names, and for an unlisted ``owner/name`` repo id a hint that a path to
    its config.json works) otherwise.
    """
    if not isinstance(target, str) or not target:
        raise ValueError(f"MODEL must be a model name or a path to config.json, got {target!r}")
    path = Path(target)
    if path.is_file() or path.is_dir():
        return from_hf_config(path, name=config_name(path))
    try:
        rec = model_record(target)
    except ValueError:
        if target.endswith(".json") or target.startswith((".", "/", "~")) or target.count("/") > 1:
            raise ValueError(f"file not found: {target!r} (MODEL is a name from `python -m kvcost models` "
                             f"or a path to a config.json)") from None
        hint = ""
        if target.count("/") == 1:
            hint = (f"; {target!r} looks like a Hugging Face repo id that kvcost has no record of: download its "
                    f"config.json and pass the path (e.g. python -m kvcost size path/to/config.json)")
        raise ValueError(f"unknown model {target!r}{hint}; known models: {', '.join(list_models())}") from None
    return from_hf_config(rec["config"], name=rec["name"])


def param_count(name: str) -> tuple[int, str]:
    """(total parameters, source) from a model record; ValueError when the record has none."""
    rec = model_record(name)
    p = rec.get("parameters")
    if not isinstance(p, dict) or not isinstance(p.get("total"), int):
        raise ValueError(f"model record {rec['name']!r} has no 'parameters.total' (cited parameter count)")
    return p["total"], str(p.get("source", ""))


def weight_dtype(name: str) -> str:
    """The storage format of the released weights (``parameters.dtype`` in the record; bf16 if absent)."""
    p = model_record(name).get("parameters") or {}
    return str(p.get("dtype", "bf16"))


def answers(name: str) -> dict[str, Any]:
    """What a record can answer: its KV cache (always), its weights (a cited parameter count, or one counted
    from the config's fields), and how its weights are quantized; a sentence for ``kvcost models``."""
    rec = model_record(name)
    p = rec.get("parameters")
    cited = isinstance(p, dict) and isinstance(p.get("total"), int)
    try:
        counted: int | None = parameter_counts(rec["config"])["total"]
        why_not = ""
    except ValueError as err:
        kind = rec["config"].get("model_type")
        text = str(err)
        counted, why_not = None, (f"kvcost does not count {kind} weights from a config" if "'model_type'" in text
                                  else text.split("; give")[0])
    q = p.get("quantized") if cited and isinstance(p.get("quantized"), dict) else None
    if cited:
        how = "counted from the config" if counted == p["total"] else "as cited"
        weights = f"weights from {p['total']:,} parameters, {how} ({p.get('dtype', 'bf16')}" + (
            f", {q['part']} in {q['dtype']})" if q else ")")
        if isinstance(p.get("experts"), int) or (q and q["part"] == "experts"):
            weights += "; decode reads only the experts a step reaches"
    else:
        weights = (f"KV cache only: no cited parameter count ({why_not or 'the record has none'}); plan --gpu needs "
                   f"--params N, --weights-gib X or --weights-index FILE")
    return {"name": rec["name"], "hf_repo": rec.get("hf_repo"), "kv_cache": True, "weights": cited,
            "parameters": p["total"] if cited else None, "counted_from_config": counted,
            "quantized_part": q["part"] if q else None, "answers": f"KV cache; {weights}" if cited else weights}
