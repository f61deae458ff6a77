"""A small Language Server Protocol client over stdio: how the tests and the latency benchmark
drive ``ampfix server`` as an editor would (JSON-RPC with Content-Length framing)."""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional


class LspClient:
    def __init__(self, cwd: str, command: Optional[List[str]] = None) -> None:
        self.proc = subprocess.Popen(command or [sys.executable, "-m", "ampfix", "server"], cwd=cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.next_id = 0
        self.inbox: "queue.Queue[dict]" = queue.Queue()
        self.seen: List[dict] = []  # every message from the server, in order, with its arrival time
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    # ------------------------------------------------------------------ wire
    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            headers = {}
            while True:
                line = out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                k, _, v = line.decode("ascii").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = out.read(int(headers["content-length"]))
            msg = json.loads(body)
            msg["_t"] = time.monotonic()
            self.inbox.put(msg)

    def send_raw(self, body: bytes) -> None:
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def send(self, obj: dict) -> None:
        self.send_raw(json.dumps(obj).encode("utf-8"))

    # ------------------------------------------------------------------ messages
    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: Any, timeout: float = 30) -> dict:
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return self.wait(lambda m: m.get("id") == rid and "method" not in m, timeout)

    def wait(self, pred: Callable[[dict], bool], timeout: float = 30) -> dict:
        for m in self.seen:
            if not m.get("_used") and pred(m):
                m["_used"] = True
                return m
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no such message from the server")
            try:
                m = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(m)
            if m.get("method") and "id" in m:  # a request from the server: answer it
                self.send({"jsonrpc": "2.0", "id": m["id"], "result": None})
            if pred(m):
                m["_used"] = True
                return m

    def diagnostics(self, uri: str, timeout: float = 30) -> dict:
        return self.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                         and m["params"]["uri"] == uri, timeout)

    def drain(self, seconds: float) -> List[dict]:
        """Every message that arrives within ``seconds``."""
        end = time.monotonic() + seconds
        got = []
        while time.monotonic() < end:
            try:
                m = self.inbox.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                continue
            self.seen.append(m)
            got.append(m)
        return got

    # ------------------------------------------------------------------ a session
    def initialize(self, root_uri: str, options: Optional[Dict] = None) -> dict:
        r = self.request("initialize", {"processId": None, "rootUri": root_uri, "capabilities": {},
                                        "workspaceFolders": [{"uri": root_uri, "name": "w"}],
                                        "initializationOptions": options or {}})
        self.notify("initialized", {})
        return r

    def close(self) -> int:
        try:
            self.request("shutdown", None, timeout=10)
            self.notify("exit", None)
        except (OSError, TimeoutError):
            pass
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
