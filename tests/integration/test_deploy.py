"""Issue 14 item 6: the Dockerfile's commands, run outside a container (no Docker engine
here): its COPY lines into a fresh directory, its RUN lines there with a fresh venv's
Python, then its ENTRYPOINT + CMD (CMD replaced by a loopback bind, as ``docker run IMAGE
--bind ...`` would) against real Redis. The hub must become ready, answer /livez and
/healthz, log JSON, and on SIGTERM (PID 1's signal) drain and exit 0."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.procs import API_KEY, REDIS_URL, SECRET, free_port, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    out = []
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_shape() -> None:
    ins = instructions()
    assert ins[0][0] == "FROM" and "slim" in ins[0][1]
    user = [rest for word, rest in ins if word == "USER"]
    assert user and user[-1] not in ("0", "root")
    (entry,) = [json.loads(rest) for word, rest in ins if word == "ENTRYPOINT"]
    assert entry[:2] == ["deskbridge-hub", "serve"]
    assert entry[entry.index("--workers") + 1] == "1"  # PID 1 is the worker: SIGTERM drains


def test_dockerfile_commands_outside_a_container(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    entry: list[str] = []
    cmd: list[str] = []
    for word, rest in instructions():
        if word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
        elif word == "COPY":
            src, dst = rest.split()
            target = app / dst
            if (ROOT / src).is_dir():
                shutil.copytree(
                    ROOT / src,
                    target,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist"),
                )
            else:
                shutil.copyfile(ROOT / src, target if dst != "./" else app / src)
        elif word == "RUN" and "useradd" not in rest:  # no users outside the container
            subprocess.run(rest, shell=True, cwd=app, env=env, check=True, timeout=600)
        elif word == "ENTRYPOINT":
            entry = json.loads(rest)
        elif word == "CMD":
            cmd = json.loads(rest)
    assert entry and cmd == ["--bind", "0.0.0.0:8080"]
    port = free_port()
    argv = [str(venv / "bin" / entry[0]), *entry[1:], "--bind", f"127.0.0.1:{port}"]
    run_env = {
        **env,
        "DESKBRIDGE_REDIS_URL": REDIS_URL,
        "DESKBRIDGE_SECRET": SECRET,
        "DESKBRIDGE_API_KEY": API_KEY,
    }
    log = tmp_path / "hub.log"
    with open(log, "wb") as out:
        hub = subprocess.Popen(argv, env=run_env, stdout=out, stderr=subprocess.STDOUT, cwd=app)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until(
                lambda: httpx.get(base + "/healthz", timeout=1).status_code == 200,
                timeout_s=60,
                what="hub ready",
            )
            assert httpx.get(base + "/livez", timeout=5).json()["ok"] is True
            # The installed package is the copy, not this checkout.
            where = "import deskbridge_hub; print(deskbridge_hub.__file__)"
            assert str(venv) in subprocess.run(
                [str(venv / "bin" / "python"), "-c", where],
                capture_output=True, text=True, check=True, env=env,
            ).stdout  # fmt: skip
            hub.send_signal(signal.SIGTERM)
            assert hub.wait(timeout=30) == 0
        finally:
            if hub.poll() is None:
                hub.kill()
                hub.wait(10)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines and all(line.startswith("{") for line in lines), lines[:5]
    assert any("draining" in json.loads(line)["message"] for line in lines)
