"""Steady client traffic through services while a node changes proxy, counted from the clients'
side. Standard library only; run inside a client's network namespace:

    python3 tests/takeover/traffic.py CONFIG.json RESULT.json

and stopped by creating CONFIG.json's "stop" file. CONFIG holds:
- "new": [[host, port], ...] TCP targets for new connections, tried in turn at "rate" per
  second: connect, send a line, read the pod's answer, close. A connection that cannot be made,
  or gives no answer within "timeout" seconds, fails.
- "long": [[host, port], ...] one long-lived TCP connection each, made at start: a line sent and
  read back every "interval" seconds. Once one goes unanswered, or the connection errs, it is
  broken (and stays so).
- "udp": [[host, port], ...] request and reply: each target asked every "interval" seconds;
  a reply that does not come within "timeout" seconds is lost.
RESULT gets the counts, and the time and error of every failure.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: dict[str, int] = {"new": 0, "long": 0, "udp": 0}
        self.failed: dict[str, list[list[Any]]] = {"new": [], "long": [], "udp": []}
        self.pods: dict[str, dict[str, int]] = {}

    def good(self, kind: str, target: str, answer: bytes) -> None:
        pod = answer.split(b" ", 1)[0].decode(errors="replace")
        with self.lock:
            self.ok[kind] += 1
            per = self.pods.setdefault(target, {})
            per[pod] = per.get(pod, 0) + 1

    def bad(self, kind: str, target: str, error: str) -> None:
        with self.lock:
            self.failed[kind].append([round(time.time(), 3), target, error])


def _name(t: list[Any]) -> str:
    host, port = t
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def new_connections(cfg: dict[str, Any], c: Counts, stop: threading.Event) -> None:
    targets = cfg["new"]
    if not targets:
        return
    period = 1.0 / cfg["rate"]
    timeout = cfg["timeout"]
    threads: list[threading.Thread] = []

    def one(t: list[Any]) -> None:
        try:
            with socket.create_connection((t[0], t[1]), timeout=timeout) as s:
                s.settimeout(timeout)
                s.sendall(b"new\n")
                answer = s.makefile("rb").readline()
            if not answer.endswith(b"new\n"):
                raise OSError(f"answer {answer!r}")
            c.good("new", _name(t), answer)
        except OSError as exc:
            c.bad("new", _name(t), str(exc) or type(exc).__name__)

    i = 0
    nxt = time.monotonic()
    while not stop.is_set():
        th = threading.Thread(target=one, args=(targets[i % len(targets)],), daemon=True)
        th.start()
        threads.append(th)
        i += 1
        nxt += period
        stop.wait(max(0.0, nxt - time.monotonic()))
        threads = [t for t in threads if t.is_alive()]
    for th in threads:
        th.join(timeout + 1)


def long_lived(t: list[Any], cfg: dict[str, Any], c: Counts, stop: threading.Event) -> None:
    name = _name(t)
    try:
        s = socket.create_connection((t[0], t[1]), timeout=cfg["timeout"])
    except OSError as exc:
        c.bad("long", name, f"connect: {exc}")
        return
    s.settimeout(cfg["timeout"])
    f = s.makefile("rb")
    seq = 0
    try:
        while not stop.is_set():
            seq += 1
            line = f"{seq}\n".encode()
            s.sendall(line)
            answer = f.readline()
            if not answer.endswith(b" " + line):
                raise OSError(f"answer {answer!r} to {seq}")
            c.good("long", name, answer)
            stop.wait(cfg["interval"])
    except OSError as exc:
        c.bad("long", name, f"after {seq - 1} answers: {exc or type(exc).__name__}")
    finally:
        s.close()


def udp(t: list[Any], cfg: dict[str, Any], c: Counts, stop: threading.Event) -> None:
    name = _name(t)
    fam = socket.AF_INET6 if ":" in t[0] else socket.AF_INET
    seq = 0
    while not stop.is_set():
        seq += 1
        # a socket (and so a source port) per request: each is a new flow through the proxy,
        # as a resolver's queries are
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.settimeout(cfg["timeout"])
            ask = f"q{seq}".encode()
            try:
                s.sendto(ask, (t[0], t[1]))
                while True:
                    answer = s.recv(512)
                    if answer.endswith(b" " + ask):
                        c.good("udp", name, answer)
                        break
            except OSError as exc:
                c.bad("udp", name, f"request {seq}: {exc or type(exc).__name__}")
        stop.wait(cfg["interval"])


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        cfg = json.load(f)
    c = Counts()
    stop = threading.Event()
    threads = [threading.Thread(target=new_connections, args=(cfg, c, stop))]
    threads += [threading.Thread(target=long_lived, args=(t, cfg, c, stop)) for t in cfg["long"]]
    threads += [threading.Thread(target=udp, args=(t, cfg, c, stop)) for t in cfg["udp"]]
    started = time.time()
    for th in threads:
        th.start()
    while not os.path.exists(cfg["stop"]):
        time.sleep(0.2)
    stop.set()
    for th in threads:
        th.join()
    with open(argv[1], "w") as out:
        json.dump({"started": started, "stopped": time.time(), "ok": c.ok,
                   "failed": c.failed, "pods": c.pods}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
