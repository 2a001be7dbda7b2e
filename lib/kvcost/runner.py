"""Run one notebook with parameters through papermill, safely (``make run``, sweeps).

A run's parameters are checked against the notebook's schema before anything starts
(unknown names and bad values stop it, naming them). The notebook then runs from
``notebooks/`` (kernel ``python3``) in a child process whose output goes to the run's
``run.log``; its tables and figures are written into a hidden ``.partial/`` folder and
renamed into the run's folder only when every cell has run, so an interrupted run never
leaves half a file. Figures always go to the run's folder (``KVCOST_FIGURE_DIR``), never
to ``figures/``. ``run.json`` records the outcome, the time taken and the kernel's peak
memory. The README (sections on re-running and sweeps) shows the layout.

A sweep may also run a script (:func:`run_script`): the same folder, log, ``run.json`` and
peak memory, with the run's parameters passed as flags (:func:`script_argv`) and ``--out``
naming the CSV it writes in the staging folder.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import papermill as pm
import psutil
import yaml
from papermill.exceptions import PapermillExecutionError

from . import __version__, notebook_params
from .output import FIGURE_DIR_ENV, repo_root
from .units import MIB

__all__ = [
    "LOG_FILE",
    "RESULT_FILE",
    "RunResult",
    "allow_runs",
    "atomic_write",
    "check_params",
    "default_out",
    "execute_run",
    "notebook_path",
    "parse_value",
    "run_in_child",
    "run_key",
    "run_notebook",
    "run_script",
    "script_argv",
    "source_hash",
    "terminate_children",
]

RESULT_FILE = "run.json"   # written last: its presence with status "finished" means the run is complete
LOG_FILE = "run.log"
STAGING = ".partial"
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass
class RunResult:
    """What happened to one run (the content of its ``run.json``)."""

    notebook: str
    params: dict[str, Any]
    key: str
    status: str                      # "finished", "failed" or "interrupted"
    error: str = ""
    seconds: float = 0.0
    peak_memory_mib: float = 0.0     # the kernel's resident set at its largest
    finished_at: str = ""
    host: str = ""
    kvcost_version: str = __version__
    files: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- naming, keys, checks

def notebook_path(name: str | os.PathLike[str]) -> Path:
    """The notebook ``name`` names: a path, a stem (``03_needle_cliff``) or its number (``03``)."""
    text = str(name)
    path = Path(text)
    if path.suffix == ".ipynb" and path.is_file():
        return path.resolve()
    folder = repo_root() / "notebooks"
    stem = path.name.removesuffix(".ipynb")
    stem = f"{int(stem):02d}" if stem.isdigit() else stem      # 3 -> 03
    found = sorted(folder.glob("*.ipynb"))
    for nb in found:
        if nb.stem == stem:
            return nb
    matches = [nb for nb in found if nb.stem.split("_", 1)[0] == stem]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(f"unknown notebook {text!r}; notebooks: {[nb.stem for nb in found]}")


def source_hash(nb: Path | str | bytes) -> str:
    """SHA-256 of a notebook's code cells (outputs and prose do not change what a run computes)."""
    text = nb.read_bytes() if isinstance(nb, Path) else nb
    cells = json.loads(text)["cells"]
    code = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c.get("cell_type") == "code"]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()


def _canonical(params: Mapping[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=list)


def run_key(nb_hash: str, params: Mapping[str, Any]) -> str:
    """A run's identity: its notebook's code, its parameters and the kvcost version."""
    blob = json.dumps([nb_hash, _canonical(params), __version__]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_params(stem: str, params: Mapping[str, Any], out: str | Path | None = None) -> None:
    """Raise ValueError naming any parameter the notebook does not declare, or any bad value,
    checked against the notebook's schema (``out``, the run's folder, is created)."""
    schema = notebook_params.get(stem)
    schema.check_unknown(params)
    if "out_dir" in params:
        raise ValueError("parameter 'out_dir' is chosen by the runner (use --out)")
    schema.validate({**params, "out_dir": str(out or tempfile.gettempdir())})


def script_argv(params: Mapping[str, Any]) -> list[str]:
    """A script run's flags: ``first_trial=3`` -> ``--first-trial 3``; a list gives several values,
    ``True`` the bare flag, ``False`` or ``None`` nothing."""
    argv: list[str] = []
    for name, value in params.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def parse_value(text: str) -> Any:
    """A ``-p NAME VALUE`` value: YAML (``1.0``, ``true``, ``[8, 3]``), numbers like ``1e-3`` too."""
    if text == "":
        return ""
    value = yaml.safe_load(text)
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def _slug(params: Mapping[str, Any]) -> str:
    parts = [f"{k}={json.dumps(v, separators=(',', ''))}" for k, v in params.items()]
    slug = re.sub(r"[^A-Za-z0-9=.,_+-]", "", "_".join(parts))
    return slug if 0 < len(slug) <= 80 else ""


def default_out(stem: str, params: Mapping[str, Any]) -> Path:
    """``results/runs/<stem>/<name=value_...>`` (or the run's key when that would be long)."""
    name = "defaults" if not params else (_slug(params) or run_key("", params))
    return Path("results") / "runs" / stem / name


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``path`` through a temporary name in the same folder, then rename it into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the run itself

class _PeakMemory:
    """Samples the resident memory of this process's children (the kernel) until stopped."""

    def __init__(self, interval: float = 0.1) -> None:
        self.peak, self._stop, self._interval = 0, threading.Event(), interval
        self._me = psutil.Process()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            total = 0
            for child in self._me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    total += child.memory_info().rss
            self.peak = max(self.peak, total)

    def __enter__(self) -> _PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        # the kernel's own high-water mark once it has exited and been reaped (Linux: KiB)
        self.peak = max(self.peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(repo_root()))
    except ValueError:
        return str(path)


def _finish(result: RunResult, peak_bytes: int, staging: Path, out: Path, what: str) -> RunResult:
    """A run's last steps: its peak memory and end time, its staged files renamed into ``out`` when
    it finished, the staging folder removed, one line to the log, ``run.json`` written last."""
    result.peak_memory_mib = round(peak_bytes / MIB, 1)
    result.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
    if result.status == "finished":
        for item in sorted(staging.iterdir()):
            target = out / item.name
            if target.is_dir():
                shutil.rmtree(target)
            os.replace(item, target)
    shutil.rmtree(staging, ignore_errors=True)
    result.files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != RESULT_FILE)
    print(f"{result.status} in {result.seconds:g} s; peak memory {result.peak_memory_mib:g} MiB "
          f"({what}, resident){'; ' + result.error if result.error else ''}", flush=True)
    atomic_write(out / RESULT_FILE, json.dumps(asdict(result), indent=1) + "\n")
    return result


def run_notebook(nb: Path, params: Mapping[str, Any], out: Path, *, kernel: str = "python3",
                 stem: str | None = None) -> RunResult:
    """Execute ``nb`` with ``params`` into folder ``out`` in this process (it should run nothing
    else: the kernel's memory is read from this process's children). Returns the result, also
    written to ``out/run.json``. Parameters must already be checked."""
    stem = stem or nb.stem
    out = Path(out).resolve()
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    result = RunResult(stem, dict(params), run_key(source_hash(nb), params), "failed", host=os.uname().nodename)
    os.environ[FIGURE_DIR_ENV] = str(staging)     # inherited by the kernel: figures stay in this run
    os.environ["PYTHONHASHSEED"] = "0"
    start = time.perf_counter()
    try:
        with _PeakMemory() as mem:
            try:
                pm.execute_notebook(str(nb), str(staging / f"{stem}.ipynb"),
                                    parameters={**params, "out_dir": _relative(staging)},
                                    cwd=str(repo_root() / "notebooks"), kernel_name=kernel,
                                    progress_bar=False, log_output=True)
                result.status = "finished"
            except PapermillExecutionError as err:
                result.error = f"cell {err.exec_count}: {err.ename}: {err.evalue}"
            except Exception as err:  # a dead kernel, a missing kernel spec ...: recorded, not raised
                result.error = f"{type(err).__name__}: {err}"
    finally:
        result.seconds = round(time.perf_counter() - start, 1)
    if result.status == "finished":
        (out / f"{stem}.failed.ipynb").unlink(missing_ok=True)
    elif (staging / f"{stem}.ipynb").is_file():
        os.replace(staging / f"{stem}.ipynb", out / f"{stem}.failed.ipynb")
    return _finish(result, mem.peak, staging, out, "kernel")


def run_script(script: Path, params: Mapping[str, Any], out: Path, *, table: str, stem: str | None = None,
               key: str = "") -> RunResult:
    """Run ``python script <flags> --out <staging>/<table>`` from the repository root into folder
    ``out``, as :func:`run_notebook` runs a notebook: its output to this process's stdout (the run's
    log), its files renamed into ``out`` only when it exits with 0, ``run.json`` last."""
    stem = stem or script.stem
    out = Path(out).resolve()
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    result = RunResult(stem, dict(params), key, "failed", host=os.uname().nodename)
    cmd = [sys.executable, str(script), *script_argv(params), "--out", str(staging / table)]
    print("$ " + " ".join(cmd[1:]), flush=True)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    tail: list[str] = []
    try:
        with _PeakMemory() as mem:
            proc = subprocess.Popen(cmd, cwd=repo_root(), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, errors="replace")
            for line in proc.stdout:
                sys.stdout.write(line)
                if line.strip():
                    tail = [*tail[-4:], line.rstrip()]
            code = proc.wait()
        if code == 0:
            result.status = "finished"
        else:
            result.error = f"exit code {code}: {tail[-1] if tail else '(no output)'}"
    finally:
        result.seconds = round(time.perf_counter() - start, 1)
    return _finish(result, mem.peak, staging, out, "script")


# --------------------------------------------------------------------------- in a child process

_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()
_STOP = threading.Event()


def allow_runs() -> None:
    """Let :func:`run_in_child` start runs again after :func:`terminate_children`."""
    _STOP.clear()


def terminate_children() -> None:
    """Stop every run this process started (each stops its kernel first) and start no more."""
    with _CHILDREN_LOCK:
        _STOP.set()
        children = list(_CHILDREN)
    for proc in children:
        if proc.poll() is None:
            proc.terminate()
    for proc in children:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_in_child(nb: Path, params: Mapping[str, Any], out: Path, *, kernel: str = "python3",
                 stem: str | None = None, table: str | None = None, key: str = "") -> RunResult:
    """:func:`run_notebook` (:func:`run_script` when ``table`` is given: ``nb`` is a script) in
    a fresh process of its own session (Ctrl-C reaches only the caller, which stops it with
    :func:`terminate_children`); its output goes to ``run.log``."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).unlink(missing_ok=True)
    spec = {"nb": str(nb), "params": dict(params), "out": str(out), "kernel": kernel, "stem": stem or nb.stem,
            "table": table, "key": key}
    with open(out / LOG_FILE, "wb") as log, _CHILDREN_LOCK:
        if _STOP.is_set():
            return RunResult(spec["stem"], dict(params), "", "interrupted", error="not started")
        proc = subprocess.Popen([sys.executable, "-m", "kvcost.runner", json.dumps(spec)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        _CHILDREN.add(proc)
    try:
        code = proc.wait()
    except BaseException:          # Ctrl-C while waiting here: the child stops its kernel and exits
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        with _CHILDREN_LOCK:
            _CHILDREN.discard(proc)
    try:
        return RunResult(**json.loads((out / RESULT_FILE).read_text()))
    except FileNotFoundError:
        status = "interrupted" if code in (-signal.SIGTERM, 128 + signal.SIGTERM) else "failed"
        return RunResult(spec["stem"], dict(params), key or run_key(source_hash(nb), params), status,
                         error=f"the run's process exited with code {code} (see {LOG_FILE})")


def execute_run(task: Mapping[str, Any]) -> dict[str, Any]:
    """One sweep run, anywhere (a local thread or a Dask worker): the notebook's source travels
    with the task; the run goes to a temporary folder and its files come back as bytes.

    ``task``: ``stem``, ``source`` (the notebook's JSON text), ``params``, ``kernel``,
    ``kvcost_version`` (a worker with another version refuses the run); for a script,
    ``table`` (the CSV it writes) and ``key``, and ``source`` is the script's text, run from the
    worker's repository root with its installed kvcost.
    Returns ``{"result": RunResult as dict, "files": {name: bytes}}``.
    """
    if task.get("kvcost_version", __version__) != __version__:
        error = f"this worker has kvcost {__version__}, the sweep was submitted with {task['kvcost_version']}"
        return {"result": asdict(RunResult(task["stem"], dict(task["params"]), "", "failed", error=error,
                                           host=os.uname().nodename)), "files": {}}
    table = task.get("table")
    with tempfile.TemporaryDirectory(prefix="kvcost-run-") as tmp:
        nb = Path(tmp) / f"{task['stem']}{'.py' if table else '.ipynb'}"
        nb.write_text(task["source"])
        out = Path(tmp) / "run"
        result = run_in_child(nb, task["params"], out, kernel=task.get("kernel", "python3"), stem=task["stem"],
                              table=table, key=task.get("key", ""))
        files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != RESULT_FILE}
    return {"result": asdict(result), "files": files}


def _child_main(spec_json: str) -> int:
    """Entry point of the child process (``python -m kvcost.runner SPEC``)."""
    spec = json.loads(spec_json)
    parent = os.getppid()
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")

    def stop(*_: Any) -> None:     # stop the kernel too: it runs in a session of its own
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
        shutil.rmtree(Path(spec["out"]) / STAGING, ignore_errors=True)   # nothing half-written stays
        os._exit(128 + signal.SIGTERM)

    def orphan_watch() -> None:    # the caller died (a Dask worker closed): do not run on alone
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=orphan_watch, daemon=True).start()
    if spec.get("table"):
        result = run_script(Path(spec["nb"]), spec["params"], Path(spec["out"]), table=spec["table"],
                            stem=spec["stem"], key=spec.get("key", ""))
    else:
        result = run_notebook(Path(spec["nb"]), spec["params"], Path(spec["out"]), kernel=spec["kernel"],
                              stem=spec["stem"])
    return 0 if result.status == "finished" else 1


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1]))
