"""The e2e node's agent: how the host runs a command on the node (integration/node/cluster.py).

guest.sh serves it on the node's address once the kubelet is started; it is the node's side of
what an operator would do in an ssh session: curl a ClusterIP from the node, read `ipvsadm
-Ln`, keep a client running while something is rolled out. Inside the e2e network namespace
only (nothing else can reach it). Standard library only.

    POST /ping                                  -> {"ok": true}
    POST /run {"argv", "timeout", "background"} -> {"rc", "out"}  (background: started, rc null)
    POST /collect {"name", "timeout"}           -> {"rc", "out"} of a background command
    POST /shutdown                              -> the agent ends (guest.sh then stops the node)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BACKGROUND: dict[str, subprocess.Popen[str]] = {}


def run(body: dict[str, Any]) -> dict[str, Any]:
    argv = [str(a) for a in body["argv"]]
    if body.get("background"):
        BACKGROUND[body["background"]] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            stdin=subprocess.DEVNULL)
        return {"rc": None, "out": ""}
    try:
        p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                           timeout=float(body.get("timeout", 120)), check=False)
    except subprocess.TimeoutExpired as exc:
        return {"rc": 124, "out": f"timed out after {exc.timeout} s: {exc.output or ''}"}
    return {"rc": p.returncode, "out": p.stdout + p.stderr}


def collect(body: dict[str, Any]) -> dict[str, Any]:
    proc = BACKGROUND.pop(body["name"])
    try:
        out, _ = proc.communicate(timeout=float(body.get("timeout", 600)))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return {"rc": 124, "out": out}
    return {"rc": proc.returncode, "out": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="ADDRESS:PORT")
    args = parser.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            try:
                if self.path == "/ping":
                    answer: dict[str, Any] = {"ok": True}
                elif self.path == "/run":
                    answer = run(body)
                elif self.path == "/collect":
                    answer = collect(body)
                elif self.path == "/shutdown":
                    answer = {"ok": True}
                    threading.Thread(target=server.shutdown, daemon=True).start()
                else:
                    answer = {"error": f"no {self.path}"}
            except Exception as exc:  # the host reads the reason
                answer = {"rc": 125, "out": f"agent: {type(exc).__name__}: {exc}"}
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    print(f"agent: listening on {args.listen}", file=sys.stderr, flush=True)
    server.serve_forever()
    for proc in BACKGROUND.values():
        proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
