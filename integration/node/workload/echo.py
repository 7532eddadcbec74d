"""The e2e workload: answers with its pod's name, over HTTP (GET any path, port 8080) and UDP
(any datagram, port 5353); and, as `echo.py get URL [N]` or `echo.py udp HOST PORT [N]`, the client
the tests run inside a pod (`kubectl exec`) and on the node. `echo.py loop STOPFILE URL...`
opens a new connection to each URL every 0.1 s until STOPFILE exists, then prints how many
answered and how many failed, as JSON (the steady traffic of a rolling update). Standard
library only."""

import json
import os
import socket
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAME = os.environ.get("POD_NAME") or socket.gethostname()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"{NAME}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def udp(port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    while True:
        _, peer = s.recvfrom(2048)
        s.sendto(NAME.encode(), peer)


def loop(stop: str, urls: list[str]) -> dict[str, dict[str, object]]:
    """A connection answered late is counted with its time (`slowest`), not as failed: under
    the lab's emulation on a loaded machine a client or a pod may wait seconds for a CPU. A
    connection refused, reset or unanswered for 10 s fails; the first five failures are kept,
    and the last (`last_error`), so that a window of failures shows where it starts and ends."""
    out: dict[str, dict[str, object]] = {u: {"ok": 0, "failed": 0, "errors": [], "slowest": 0.0,
                                             "last_error": ""} for u in urls}
    while not os.path.exists(stop):
        for url in urls:
            t = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
                out[url]["ok"] += 1  # type: ignore[operator]
                took = round(time.monotonic() - t, 3)
                out[url]["slowest"] = max(took, out[url]["slowest"])  # type: ignore[call-overload]
            except OSError as exc:
                out[url]["failed"] += 1  # type: ignore[operator]
                error = f"{time.strftime('%H:%M:%S')} {exc}"
                errors = out[url]["errors"]
                if isinstance(errors, list) and len(errors) < 5:
                    errors.append(error)
                out[url]["last_error"] = error
        time.sleep(0.1)
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["loop"]:
        print(json.dumps(loop(argv[1], argv[2:])))
        return 0
    if argv[:1] == ["get"]:  # get URL [N]: N requests, each on a new connection
        for _ in range(int(argv[2]) if len(argv) > 2 else 1):
            with urllib.request.urlopen(argv[1], timeout=5) as r:
                sys.stdout.write(r.read().decode())
        return 0
    if argv[:1] == ["udp"]:  # udp HOST PORT [N]: N datagrams, each from a new socket
        for _ in range(int(argv[3]) if len(argv) > 3 else 1):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(5)
            s.sendto(b"?", (argv[1], int(argv[2])))
            print(s.recv(2048).decode())
            s.close()
        return 0
    threading.Thread(target=udp, args=(5353,), daemon=True).start()
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
