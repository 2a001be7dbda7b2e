"""`make lab` serves the repository root (as root too), passes LAB_ARGS through, and saves notebooks in
their committed form: a notebook saved as JupyterLab sends it after a run leaves `git diff` empty."""
import contextlib
import copy
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "kvcost-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_pid(runtime: Path) -> int | None:
    for f in runtime.glob("jpserver-*.json"):
        return json.loads(f.read_text())["pid"]
    return None


def _api(base: str, path: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(f"{base}/api/contents/{path}", method="GET" if body is None else "PUT",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The base URL of `make lab`, started once for this module on a free port."""
    tmp = tmp_path_factory.mktemp("lab")
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), JUPYTER_CONFIG_DIR=str(tmp / "cfg"))
    env.pop("JUPYTER_CONFIG_PATH", None)
    args = f"--no-browser --ServerApp.port={port} --ServerApp.port_retries=0 --IdentityProvider.token={TOKEN}"
    # -o: the environment is the one running these tests; without it a checkout newer than .venv/.installed
    # (a worktree sharing the venv) re-ran setup and re-pointed the editable install at itself
    proc = subprocess.Popen(["make", "-s", "-o", ".venv/.installed", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    pid = None
    try:
        base = f"http://127.0.0.1:{port}"
        deadline, up = time.time() + 90, False
        while time.time() < deadline and not up:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                _api(base, "")
                up = True
            except OSError:
                time.sleep(0.5)
        assert up, "JupyterLab did not answer within 90 s"
        pid = _server_pid(tmp / "runtime")
        assert pid is not None
        yield base
    finally:
        pid = pid or _server_pid(tmp / "runtime")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)      # the server's own process id, from its runtime file
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode is not None


def test_make_lab_lists_the_notebooks(lab):
    names = {c["name"] for c in _api(lab, "notebooks")["content"]}
    assert "03_needle_cliff.ipynb" in names and "01_sizing.ipynb" in names


def _as_lab_saves_it(nb: dict) -> dict:
    """``nb`` as JupyterLab sends it after opening it and running every cell: the kernel's display name
    and language_info (with the interpreter's version), consecutive streams merged, per-cell timings,
    trust and scroll state."""
    nb = copy.deepcopy(nb)
    nb["metadata"]["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb["metadata"]["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py", "mimetype": "text/x-python",
        "name": "python", "nbconvert_exporter": "python", "pygments_lexer": "ipython3",
        "version": platform.python_version()}
    stamp = "2026-12-01T10:00:00.000000Z"
    for cell in nb["cells"]:
        outputs = []
        for o in cell.get("outputs", []):     # Lab holds consecutive streams of one name as one
            if o["output_type"] == "stream" and outputs and outputs[-1]["output_type"] == "stream" \
                    and outputs[-1]["name"] == o["name"]:
                outputs[-1] = {**outputs[-1], "text": outputs[-1]["text"] + o["text"]}
            else:
                outputs.append(o)
        if "outputs" in cell:
            cell["outputs"] = outputs
        cell["metadata"]["trusted"] = True
        if cell["cell_type"] == "code":
            cell["metadata"]["execution"] = {k: stamp for k in ("iopub.execute_input", "iopub.status.busy",
                                                                "iopub.status.idle", "shell.execute_reply")}
            cell["metadata"]["scrolled"] = False
            cell["metadata"]["collapsed"] = False
    return nb


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          capture_output=True, text=True)


def test_a_notebook_saved_from_lab_leaves_git_clean(lab):
    # A scratch git repository under the served root (build/ is ignored), holding the committed notebooks.
    rel = Path("build") / "test_lab" / uuid.uuid4().hex
    repo = ROOT / rel
    (repo / "notebooks").mkdir(parents=True)
    try:
        names = _git(ROOT, "ls-files", "notebooks/*.ipynb").stdout.split()
        assert len(names) >= 10
        for name in names:
            (repo / name).write_bytes(subprocess.run(["git", "show", f"HEAD:{name}"], cwd=ROOT, capture_output=True,
                                                     check=True).stdout)
        assert _git(repo, "init", "-q").returncode == 0
        assert _git(repo, "add", "notebooks").returncode == 0 and _git(repo, "commit", "-qm", "c").returncode == 0
        for name in names:
            model = _api(lab, f"{rel.as_posix()}/{name}")
            lab_nb = _as_lab_saves_it(model["content"])
            assert lab_nb["metadata"]["language_info"]["version"]
            saved = _api(lab, f"{rel.as_posix()}/{name}", {"type": "notebook", "format": "json", "content": lab_nb})
            assert saved["last_modified"]
        diff = _git(repo, "diff", "--stat")
        assert diff.returncode == 0 and diff.stdout == "", diff.stdout      # every save left the file's bytes
        assert _git(repo, "diff", "--quiet").returncode == 0
        # a real edit is saved, and seen: the saves above did reach the files
        edited = _as_lab_saves_it(_api(lab, f"{rel.as_posix()}/{names[0]}")["content"])
        edited["cells"][0]["source"] += "\n\nedited"
        _api(lab, f"{rel.as_posix()}/{names[0]}", {"type": "notebook", "format": "json", "content": edited})
        assert _git(repo, "diff", "--quiet").returncode == 1
        assert _git(repo, "diff", "--name-only").stdout.split() == [names[0]]
    finally:
        shutil.rmtree(repo, ignore_errors=True)
        with contextlib.suppress(OSError):
            repo.parent.rmdir()                # build/test_lab, when no other run is using it
