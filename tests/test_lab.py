"""`make lab` serves the repository root (as root too) and passes LAB_ARGS through."""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_pid(runtime: Path) -> int | None:
    for f in runtime.glob("jpserver-*.json"):
        return json.loads(f.read_text())["pid"]
    return None


def test_make_lab_lists_the_notebooks(tmp_path):
    port, token = _free_port(), "kvcost-test-token"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    args = f"--no-browser --ServerApp.port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}"
    proc = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    pid = None
    try:
        url = f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}"
        deadline, listing = time.time() + 90, None
        while time.time() < deadline and listing is None:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    listing = json.load(r)
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "JupyterLab did not answer within 90 s"
        names = {c["name"] for c in listing["content"]}
        assert "03_needle_cliff.ipynb" in names and "01_sizing.ipynb" in names
        pid = _server_pid(tmp_path / "runtime")
        assert pid is not None
    finally:
        pid = pid or _server_pid(tmp_path / "runtime")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)      # the server's own process id, from its runtime file
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode is not None
