"""Run one notebook with parameters through papermill, safely (``make run``, sweeps).

A run's parameters are checked against the notebook's schema before anything starts
(unknown names and bad values stop it, naming them). The notebook then runs from
``notebooks/`` (kernel ``python3``) in a child process whose output goes to the run's
``run.log``; its tables and figures are written into a hidden ``.partial/`` folder and
renamed into the run's folder only when every cell has run, so an interrupted run never
leaves half a file. Figures always go to the run's folder (``KVCOST_FIGURE_DIR``), never
to ``figures/``. ``run.json`` records the outcome, the time taken and the kernel's peak
memory. The README (sections on re-running and sweeps) shows the layout.

Every run is pinned to one BLAS / OpenMP / numba thread (:data:`THREADS`, recorded in
``run.json``): a sum's order, and so its last bits, would otherwise depend on the machine's
core count. A run's folder is checked first (:func:`check_out`: never inside the repository's
own folders, never a folder that holds something else) and held by one process at a time
(:func:`folder_lock`); the staging folder is named per process, and what a killed run left
behind (its staging folder, its ``kvcost-run-*`` temporary folder) is removed on the next start.

A sweep may also run a script (:func:`run_script`): the same folder, log, ``run.json`` and
peak memory, with the run's parameters passed as flags (:func:`script_argv`) and ``--out``
naming the CSV it writes in the staging folder.
"""
from __future__ import annotations

import contextlib
import fcntl
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import papermill as pm
import psutil
import yaml
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.exceptions import PapermillExecutionError
from papermill.utils import merge_kwargs, remove_args

from kvcost import __version__, notebook_params
from kvcost.output import FIGURE_DIR_ENV
from kvcost.params import shorten
from kvcost.paths import repo_root
from kvcost.units import MIB

__all__ = [
    "LOG_FILE",
    "PROTECTED",
    "RESULT_FILE",
    "THREADS",
    "RunResult",
    "allow_runs",
    "atomic_write",
    "check_out",
    "check_params",
    "clean_leftovers",
    "folder_lock",
    "inside",
    "is_run_folder",
    "load_yaml",
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

class _MarkdownLogClient(PapermillNotebookClient):
    """papermill's client, logging a displayed Markdown object (a notebook's verdict) as its text: papermill
    logs an output's text/plain, which for ``IPython.display.Markdown`` is ``<... Markdown object>``."""

    def log_output_message(self, output: Any) -> None:
        data = output.get("data", {}) if output.output_type in ("display_data", "execute_result") else {}
        if self.log_output and "text/markdown" in data:
            self.log.info("".join(data["text/markdown"]))
        else:
            super().log_output_message(output)


class _MarkdownLogEngine(NBClientEngine):
    """papermill's nbclient engine with :class:`_MarkdownLogClient` (papermill's own arguments, unchanged)."""

    @classmethod
    def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, log_output: bool = False,
                                 stdout_file: Any = None, stderr_file: Any = None, start_timeout: int = 60,
                                 execution_timeout: int | None = None, **kwargs: Any) -> Any:
        kwargs = remove_args(["input_path"], **kwargs)
        safe = remove_args(["timeout", "startup_timeout"], **kwargs)
        final = merge_kwargs(safe, timeout=execution_timeout if execution_timeout else kwargs.get("timeout"),
                             startup_timeout=start_timeout, kernel_name=kernel_name, log=logging.getLogger("papermill"),
                             log_output=log_output, stdout_file=stdout_file, stderr_file=stderr_file)
        return _MarkdownLogClient(nb_man, **final).execute()


ENGINE = "kvcost-markdown-log"
papermill_engines.register(ENGINE, _MarkdownLogEngine)

RESULT_FILE = "run.json"   # written last: its presence with status "finished" means the run is complete
LOG_FILE = "run.log"
STAGING = ".partial"      # a run's staging folder: .partial-<pid> (one per process)
TEMP_PREFIX = "kvcost-run-"
#: The repository's own folders: a run's --out is never one of them or inside one.
PROTECTED = ("data", "notebooks", "lib", "tests", "figures", "scripts", "sweeps", "docs", ".git", ".venv")
#: Threads of every BLAS / OpenMP / numba pool in a run (its kernel or script inherits them).
THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                                  "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS")}


class _Loader(yaml.SafeLoader):
    """YAML read as papermill reads a ``-p`` value and as YAML 1.2 does: decimal integers (``017`` is
    17, not octal 15), floats with or without a dot (``1e-3``), ``true``/``false``, ``null``; no YAML 1.1
    base-60 (``1:30`` stays text), octal, ``yes``/``on`` booleans or dates. A key given twice and an
    alias (``*name``: nested aliases blow up exponentially) are refused."""

    yaml_implicit_resolvers: ClassVar[dict] = {}     # only the resolvers below: no YAML 1.1 ones

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: set = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                with contextlib.suppress(TypeError):
                    if key in seen:
                        raise yaml.constructor.ConstructorError(None, None, f"key {shorten(key)} is given twice",
                                                                key_node.start_mark)
                    seen.add(key)
        return super().construct_mapping(node, deep)


for _tag, _rx, _first in (
        ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
        ("int", r"^[-+]?[0-9]+$", "-+0123456789"),
        ("float", r"^(?:[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
                  r"|[-+]?\.?(?:inf|Inf|INF|infinity|Infinity)|\.?(?:nan|NaN|NAN))$", "-+.0123456789iInN"),
        ("null", r"^(?:~|null|Null|NULL|None|)$", ["~", "n", "N", ""])):
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_rx), list(_first))
_Loader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node), 10))


def _float(loader: _Loader, node: Any) -> float:
    text = loader.construct_scalar(node)
    return float(text.replace(".", "", 1) if text.lstrip("+-")[:2].lower() in (".i", ".n") else text)


_Loader.add_constructor("tag:yaml.org,2002:float", _float)
_Loader.add_constructor("tag:yaml.org,2002:null", lambda loader, node: None)


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
    threads: dict[str, str] = field(default_factory=dict)   # the pinned thread counts (THREADS)


# --------------------------------------------------------------------------- naming, keys, checks

def notebook_path(name: str | os.PathLike[str]) -> Path:
    """The notebook ``name`` names: a path, a stem (``03_needle_cliff``) or its number (``03``)."""
    text = str(name)
    path = Path(text)
    if path.suffix == ".ipynb" and _is_file(path):
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
    raise ValueError(f"unknown notebook {shorten(text)}; notebooks: {[nb.stem for nb in found]}")


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a name the system refuses (too long, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


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
    checked against the notebook's schema (nothing is created)."""
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


def load_yaml(text: str, where: str = "YAML") -> Any:
    """``text`` read as YAML the way :class:`_Loader` reads it; ValueError (one line, starting with
    ``where``) for text that is not valid YAML, a key given twice, an alias or runaway nesting."""
    try:
        return yaml.load(text, Loader=_Loader)   # _Loader is a SafeLoader: no object construction
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{where}: not valid YAML: {problem}{at}") from None
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply") from None


def parse_value(text: str) -> Any:
    """A ``-p NAME VALUE`` value: YAML (``1.0``, ``true``, ``[8, 3]``) read as papermill reads numbers
    (``1e-3``, ``017`` = 17; ``2001-01-01`` and ``1:30`` stay text); ValueError for invalid YAML."""
    if text == "":
        return ""
    return load_yaml(text, f"value {shorten(text)}")


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


# --------------------------------------------------------------------------- where a run may write

def is_run_folder(folder: Path) -> bool:
    """True when ``folder`` holds a previous run of ``python -m kvcost.run``: its ``run.json``, or only
    the ``run.log`` (and staging folder) of a run that was interrupted before it wrote one."""
    try:
        rec = json.loads((Path(folder) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        names = [p.name for p in Path(folder).iterdir()]
        return LOG_FILE in names and all(n == LOG_FILE or n.startswith(STAGING) for n in names)
    return isinstance(rec, dict) and {"notebook", "key", "status"} <= set(rec)


def check_out(out: str | os.PathLike[str], *, flag: str = "--out",
              previous: Callable[[Path], bool] = is_run_folder, what: str = "run") -> Path:
    """``out`` resolved, once it is known to be a safe place for a run's files; ValueError naming
    ``flag`` otherwise. Refused: the filesystem root, the repository root or a folder above it,
    anything inside the repository's own folders (:data:`PROTECTED`), a path that is not a folder,
    a folder that cannot be written, and a non-empty folder that ``previous`` does not recognise as
    an earlier ``what`` of the same tool. Nothing is created here."""
    text = shorten(str(out))
    path = Path(out).expanduser()
    path = (path if path.is_absolute() else repo_root() / path).resolve()
    root = repo_root().resolve()
    if path == Path(path.anchor):
        raise ValueError(f"{flag} {text}: the filesystem root cannot hold a {what}; give a folder of its own "
                         f"(default under results/)")
    if root.is_relative_to(path):
        raise ValueError(f"{flag} {text}: the repository root (or a folder above it) cannot hold a {what}; "
                         f"give a folder of its own, e.g. under results/")
    for name in PROTECTED:
        if path.is_relative_to(root / name):
            raise ValueError(f"{flag} {text}: inside the repository's {name}/, which a {what} never writes; "
                             f"give a folder under results/ or outside the repository")
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{flag} {text}: exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {text}: the folder is not writable")
        if any(path.iterdir()) and not previous(path):
            raise ValueError(f"{flag} {text}: the folder is not empty and holds no earlier {what} of this tool; "
                             f"give an empty or new folder")
        return path
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {text}: cannot be created ({_relative(parent)} is not a writable folder)")
    return path


def inside(folder: Path, name: str) -> Path:
    """``folder / name`` when ``name`` is a plain file name that stays in ``folder``; ValueError otherwise
    (a name read from a file, such as ``tables.json``, must not reach outside the run's folder)."""
    folder = Path(folder).resolve()
    target = (folder / str(name)).resolve()
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..") or target.parent != folder:
        raise ValueError(f"{shorten(name)}: not a file name inside {_relative(folder)}")
    return target


@contextlib.contextmanager
def folder_lock(folder: Path, what: str = "run") -> Iterator[None]:
    """Hold ``folder`` (created) for this process alone while the block runs; ValueError at once when
    another process holds it. The lock is the kernel's (flock on the folder): it goes with its
    process, so a killed run never leaves a stale one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"{_relative(folder)}: another {what} is writing there now; wait for it to finish "
                         f"or give another --out") from None
    try:
        yield
    finally:
        os.close(fd)


def _staging(out: Path) -> Path:
    return Path(out) / f"{STAGING}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                # another user's process: alive
        return True
    return True


def clean_leftovers(out: Path | None = None) -> list[Path]:
    """Remove what killed runs left behind: ``out``'s staging folders (call it holding ``out``'s lock)
    and this user's ``kvcost-run-<pid>-*`` temporary folders whose process is gone and that no run holds
    (a run holds its own with :func:`folder_lock`). Returns what was removed."""
    removed = []
    if out is not None and Path(out).is_dir():
        for stale in Path(out).glob(f"{STAGING}*"):
            if stale.name == STAGING or stale.name.removeprefix(f"{STAGING}-").isdigit():
                pid = stale.name.removeprefix(f"{STAGING}-")
                if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)) and stale.is_dir():
                    continue           # another live process's (it holds the folder): not ours to remove
                shutil.rmtree(stale, ignore_errors=True)
                removed.append(stale)
    for tmp in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = tmp.name.removeprefix(TEMP_PREFIX).split("-", 1)[0]
        try:
            if (not pid.isdigit() or _alive(int(pid)) or tmp.is_symlink() or not tmp.is_dir()
                    or tmp.lstat().st_uid != os.getuid()):
                continue
            with folder_lock(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
        except (OSError, ValueError):      # gone meanwhile, or a live run holds it
            continue
    return removed


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


def _start(out: Path) -> Path:
    """A run's first step in its process: the thread counts pinned (inherited by the kernel or the
    script), hash seeds fixed, staging folders of killed runs removed, this process's made."""
    os.environ.update(THREADS)
    os.environ["PYTHONHASHSEED"] = "0"
    clean_leftovers(out)
    staging = _staging(out)
    staging.mkdir(parents=True)
    return staging


def run_notebook(nb: Path, params: Mapping[str, Any], out: Path, *, kernel: str = "python3",
                 stem: str | None = None) -> RunResult:
    """Execute ``nb`` with ``params`` into folder ``out`` in this process (it should run nothing
    else: the kernel's memory is read from this process's children). Returns the result, also
    written to ``out/run.json``. Parameters must already be checked."""
    stem = stem or nb.stem
    out = Path(out).resolve()
    staging = _start(out)
    result = RunResult(stem, dict(params), run_key(source_hash(nb), params), "failed", host=os.uname().nodename,
                       threads=dict(THREADS))
    os.environ[FIGURE_DIR_ENV] = str(staging)     # inherited by the kernel: figures stay in this run
    start = time.perf_counter()
    try:
        with _PeakMemory() as mem:
            try:
                pm.execute_notebook(str(nb), str(staging / f"{stem}.ipynb"),
                                    parameters={**params, "out_dir": _relative(staging)},
                                    cwd=str(repo_root() / "notebooks"), kernel_name=kernel,
                                    progress_bar=False, log_output=True, engine_name=ENGINE)
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
    staging = _start(out)
    result = RunResult(stem, dict(params), key, "failed", host=os.uname().nodename, threads=dict(THREADS))
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
                                start_new_session=True, env={**os.environ, **THREADS, "PYTHONHASHSEED": "0"})
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
    clean_leftovers()
    tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    try:
        with folder_lock(tmp):        # marks it in use: clean_leftovers elsewhere leaves it alone
            nb = tmp / f"{task['stem']}{'.py' if table else '.ipynb'}"
            nb.write_text(task["source"])
            out = tmp / "run"
            result = run_in_child(nb, task["params"], out, kernel=task.get("kernel", "python3"), stem=task["stem"],
                                  table=table, key=task.get("key", ""))
            files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file() and p.name != RESULT_FILE}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
        shutil.rmtree(_staging(Path(spec["out"])), ignore_errors=True)   # nothing half-written stays
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
