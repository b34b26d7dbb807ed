"""A real ``ragpic serve`` process on a free loopback port, for the server tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tiny import saved_tiny_model

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m ragpic.cli serve ARGS --port N`` as a child; :meth:`stop` ends it."""

    def __init__(self, *args: str, home: Path, timeout_s: float = 120.0, isolate: bool = True, threads: int = 1):
        """``home``: working folder (and ``$RAGPIC_HOME`` when ``isolate``; the embedded model's
        one-time conversion lives in the real one, so SmolLM2 servers pass ``isolate=False``)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
        if isolate:
            env["RAGPIC_HOME"] = str(home)
        self.log = open(home / f"serve-{self.port}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "ragpic.cli", "serve", "--port", str(self.port), *args],
                                     cwd=home, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"ragpic serve did not start: {self.output()[-3000:]}")
            time.sleep(0.2)

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return Path(self.log.name).read_text()

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 120), **kw)

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever (scale-out tests)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0, *, signalled: bool = False) -> bool:
        """SIGTERM (unless ``signalled``: sent already), wait up to ``timeout`` s for the process to
        exit, then SIGKILL it; True if it exited by itself (a killed one flushed nothing)."""
        exited = True
        if self.proc.poll() is None:
            if not signalled:
                self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                exited = False
                self.kill()
        self.log.close()
        return exited


# -- shared by the tiny-model server tests (test_serve_edges, test_serve_lifecycle) ----------
KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "hi there, who are you?"}]


def sentences() -> list[str]:
    """The tiny corpus's sentences of six words or more (each a cacheable chunk)."""
    from tiny import TEXT

    return [s.strip() + "." for s in TEXT.split(".") if len(s.split()) >= 6]


def body(**extra) -> dict:
    """A short chat request to the tiny model (``model: tiny``)."""
    return {"model": "tiny", "messages": HI, "max_tokens": 4, **extra}


def long_body(n: int) -> dict:
    """A ~360-token ``full`` prompt (linked in many pieces) asking for ``n`` tokens."""
    text = " ".join(sentences() * 2)
    return {"model": "tiny", "method": "full", "max_tokens": n,
            "messages": [{"role": "user", "content": f"{text}\n\nquestion: what now?"}]}


def wait_for(pred, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def tiny_home(tmp_path_factory, name: str, **overrides) -> Path:
    """A fresh folder for one test module's servers, with a tiny random model saved at ``model/``
    (``overrides``: its config's, e.g. a longer context window)."""
    home = tmp_path_factory.mktemp(name)
    saved_tiny_model(home / "model", **overrides)
    return home
