"""Notebooks as committed: volatile metadata stripped, so re-running or saving one changes no bytes.

One normal form, applied where notebooks are written: ``make notebooks`` (``scripts/nbclean.py``
after papermill) and every save from JupyterLab (:func:`pre_save_hook`, the Jupyter server's
``ContentsManager.pre_save_hook`` set in ``.jupyter/jupyter_server_config.py``, which ``make lab``
loads). It removes papermill's notebook and cell metadata, per-cell timing and UI state, the
interpreter's patch version that a kernel reports (``language_info.version``), and gives the
``python3`` kernelspec the display name a running kernel reports, and merges consecutive stream
outputs of one name as JupyterLab does; it keeps outputs and execution counts (nbval needs both, and
merges streams itself). A notebook whose outputs hold a machine path is refused by ``make
notebooks`` (:func:`machine_path`; a notebook must never print one).
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["KERNEL_DISPLAY_NAMES", "MACHINE_PATH", "VOLATILE_CELL_KEYS", "clean", "dumps", "machine_path", "main",
           "pre_save_hook"]

MACHINE_PATH = re.compile(r"/(?:work|root|tmp|home|farm|Users)/[^\s\"']+")
#: Cell metadata that records a run or the editor's state, not the notebook: papermill's, the timing
#: JupyterLab records (``execution``), output collapse/scroll state and a trust flag.
VOLATILE_CELL_KEYS = ("papermill", "execution", "collapsed", "scrolled", "trusted")
#: The display name a running kernel writes into ``kernelspec`` (JupyterLab sets it on every start).
KERNEL_DISPLAY_NAMES = {"python3": "Python 3 (ipykernel)"}


def clean(nb: dict[str, Any]) -> dict[str, Any]:
    """``nb`` (a notebook as JSON) in its committed form, changed in place and returned."""
    meta = nb.setdefault("metadata", {})
    meta.pop("papermill", None)
    meta.pop("widgets", None)
    # the interpreter's patch version is the machine's, not the notebook's
    meta.get("language_info", {}).pop("version", None)
    spec = meta.get("kernelspec")
    if isinstance(spec, dict) and spec.get("name") in KERNEL_DISPLAY_NAMES:
        spec["display_name"] = KERNEL_DISPLAY_NAMES[spec["name"]]
    for cell in nb.get("cells", []):
        cmeta = cell.setdefault("metadata", {})
        for key in VOLATILE_CELL_KEYS:
            cmeta.pop(key, None)
        if cmeta.get("jupyter") == {}:
            del cmeta["jupyter"]
        tags = [t for t in cmeta.get("tags", []) if t != "injected-parameters"]
        if "tags" in cmeta:
            cmeta["tags"] = tags
            if not tags:
                del cmeta["tags"]
        if cell.get("outputs"):
            cell["outputs"] = _merged_streams(cell["outputs"])
    return nb


def _merged_streams(outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive stream outputs of one name as one, as JupyterLab holds them (it merges them when it
    opens or runs a notebook; nbclient keeps each message apart). Text stays a list of lines where it was
    one (the file form), a string where it was a string (the form the server's REST API carries)."""
    out: list[dict[str, Any]] = []
    for o in outputs:
        last = out[-1] if out else None
        if (o.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                and last.get("name") == o.get("name")):
            as_list = isinstance(last["text"], list)
            text = "".join(last["text"]) + ("".join(o["text"]) if isinstance(o["text"], list) else o["text"])
            last["text"] = text.splitlines(keepends=True) if as_list else text
        else:
            out.append(o)
    return out


def dumps(nb: dict[str, Any]) -> str:
    """The notebook's file text, as nbformat (and so the Jupyter server) writes it."""
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def machine_path(text: str) -> str | None:
    """The first machine path in ``text`` (a notebook's file text), or None."""
    match = MACHINE_PATH.search(text)
    return match.group(0) if match else None


def pre_save_hook(model: dict[str, Any], **_: Any) -> None:
    """The Jupyter server's pre-save hook: a notebook is saved in its committed form (:func:`clean`)."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        clean(model["content"])


def main(argv: Sequence[str] | None = None) -> int:
    """``python scripts/nbclean.py NOTEBOOK...``: rewrite each in its committed form; 1 when an output
    holds a machine path (the notebook is still rewritten, and named)."""
    status = 0
    for name in sys.argv[1:] if argv is None else argv:
        path = Path(name)
        text = dumps(clean(json.loads(path.read_text(encoding="utf-8"))))
        found = machine_path(text)
        if found:
            print(f"{path}: output holds a machine path {found[:80]!r}", file=sys.stderr)
            status = 1
        path.write_text(text, encoding="utf-8")
    return status
