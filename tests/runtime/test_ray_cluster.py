"""Joining a Ray cluster at runtime.address, through the real CLI: an address where no Ray cluster
answers ends in one line naming it, within the connect bound (ray.init alone waits without end)."""

import socket
import socketserver
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("ray")

from helpers import without_plan  # noqa: E402

pytestmark = pytest.mark.ray
ROOT = Path(__file__).parents[2]


def _train(address: str, run: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "configs/frozen_lake.yaml", "runtime.kind=ray",
                           f"runtime.address={address}", f"run_dir={run}", f"model.cache_dir={run.parent / 'cache'}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def _one_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stderr[-2000:]
    lines = without_plan(res.stderr).strip().splitlines()  # a run logs its plan first
    assert len(lines) == 1, res.stderr[-2000:]
    return lines[0]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_nothing_listens_is_one_line(tmp_path):
    port = _closed_port()
    line = _one_line(_train(f"127.0.0.1:{port}", tmp_path / "run"))
    assert f"runtime.address=127.0.0.1:{port}: cannot connect" in line and "ray status" in line
    assert not (tmp_path / "cache").exists()  # no model was built


class _Http(socketserver.StreamRequestHandler):
    def handle(self):
        self.rfile.readline()
        self.wfile.write(b"HTTP/1.0 400 Bad Request\r\n\r\n")


def test_an_address_where_another_server_answers_is_one_line(tmp_path):
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Http) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        line = _one_line(_train(f"127.0.0.1:{port}", tmp_path / "run"))
        server.shutdown()
    assert f"runtime.address=127.0.0.1:{port}: something answers there, but not a Ray cluster" in line
