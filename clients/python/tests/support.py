"""Test helpers: a real daemon driven by clients/testdaemon.sh, a scripted stand-in
daemon for the shared conformance table, and the table itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import threading
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.environ.get("RL_CLIENTS_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))
TESTDAEMON = os.path.join(CLIENTS, "testdaemon.sh")
CONFORMANCE = os.path.join(CLIENTS, "conformance.json")


def tmpdir(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("RL_TEST_ROOT"))


def load_cases(table: str = "cases") -> List[dict]:
    """One table of clients/conformance.json: cases, several_cases, several_header_cases."""
    with open(CONFORMANCE, encoding="utf-8") as f:
        return json.load(f)[table]


class Daemon:
    """A real daemon (redis.mode = "none") in a temp dir."""

    def __init__(self) -> None:
        self.dir = tmpdir("rl-py-")
        self.socket = os.path.join(self.dir, "rl.sock")
        self.start()

    def _run(self, cmd: str) -> None:
        subprocess.run(["bash", TESTDAEMON, cmd, self.dir], check=True, timeout=30)

    def start(self) -> None:
        self._run("start")

    def stop(self) -> None:
        self._run("stop")

    def pause(self) -> None:
        self._run("pause")

    def resume(self) -> None:
        self._run("resume")


class FakeDaemon:
    """The conformance table's stand-in daemon: mode 'reply' answers the i-th request
    line of a connection with replies[i] (closing after ERR BUSY/PERM), 'stall' never
    answers, 'close' closes after reading, 'absent' has no socket. Records every
    request line it read."""

    def __init__(self, mode: str, replies: Optional[List[str]] = None) -> None:
        self.mode, self.replies = mode, list(replies or [])
        self.path = os.path.join(tmpdir("rl-py-fake-"), "fake.sock")
        self.requests: List[str] = []
        self.connections = 0
        self._stop = threading.Event()
        self._conns: List[socket.socket] = []
        self._srv: Optional[socket.socket] = None
        if mode != "absent":
            self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._srv.bind(self.path)
            self._srv.listen(16)
            self._srv.settimeout(0.05)
            threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self._srv is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf, i = b"", 0
        conn.settimeout(0.05)
        while not self._stop.is_set():
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.requests.append(line.decode("ascii", "replace"))
                if self.mode == "close":
                    conn.close()
                    return
                if self.mode == "stall" or i >= len(self.replies):
                    continue
                reply = self.replies[i]
                i += 1
                try:
                    conn.sendall(reply.encode() + b"\n")
                except OSError:
                    return
                if reply.startswith(("ERR BUSY", "ERR PERM")):
                    conn.close()
                    return
        conn.close()

    def close(self) -> None:
        self._stop.set()
        if self._srv is not None:
            self._srv.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
