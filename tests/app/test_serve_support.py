"""Helpers the `specgen serve` tests share (no tests here): a real server process on a free port."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tiny_models import free_port

ROOT = Path(__file__).resolve().parents[2]
CODE_PAIR = ["--model", "assets/code/target", "--draft", "assets/code/draft"]
MODEL = "assets/code/target"
KEY = "test-key"


class Server:
    """`specgen serve ARGS` as a subprocess: started, waited for until /health answers, stopped with SIGTERM."""

    def __init__(self, *args: str, startup_s: float = 300.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")  # the server's stderr, shown when it fails to start
        env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen([sys.executable, "-m", "specgen", "serve", *args, "--port", str(self.port)],
                                        cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                        stderr=self.log)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"specgen serve exited with {self.process.returncode} at start-up:\n"
                                   f"{self.log.read()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("specgen serve did not answer /health in time")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


def client(server: Server, **options):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120, **options)
