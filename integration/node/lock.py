"""Pin the image's Python packages by hash: rewrite deploy/requirements.txt (`make lock`).

deploy/requirements.txt names every package the image installs at one version (its `name==version`
lines are the source of truth, checked against pyproject.toml by tests/unit/test_deploy.py);
this adds to each the sha256 of every file pip may pick for the image's platforms, CPython 3.11
on manylinux x86_64 and aarch64 (the wheels `pip download` finds for each), so the Dockerfile's
`pip install --require-hashes` refuses any file that changed on the index, and any package that
is not listed. Run it after changing a version; it needs PyPI (pip's own client).

    python -m integration.node.lock            # rewrite deploy/requirements.txt
    python -m integration.node.lock --check    # exit 1 if a pin has no hash
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "deploy" / "requirements.txt"
# pip's tags for the image: python:3.11-slim-bookworm is glibc 2.36, amd64 and arm64.
PLATFORMS = {
    "x86_64": ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"),
    "aarch64": ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64"),
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(the header comment lines, [(name, version)]) of a requirements file, with or without
    hashes."""
    header: list[str] = []
    pins: list[tuple[str, str]] = []
    for line in text.splitlines():
        s = line.strip()
        if not pins and s.startswith("#"):
            header.append(line)
        m = re.match(r"^([A-Za-z0-9][\w.-]*)==([\w.]+)", s)
        if m:
            pins.append((m.group(1), m.group(2)))
    return header, pins


def hashes(pins: list[tuple[str, str]]) -> dict[str, set[str]]:
    """canonical name -> sha256 of each file pip downloads for the image's platforms."""
    out: dict[str, set[str]] = {canonical(n): set() for n, _ in pins}
    with tempfile.TemporaryDirectory(prefix="ipvsproxy-lock-") as tmp:
        reqs = Path(tmp) / "pins.txt"
        reqs.write_text("".join(f"{n}=={v}\n" for n, v in pins))
        for arch, tags in PLATFORMS.items():
            dest = Path(tmp) / arch
            argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                    "--abi", "cp311", "--abi", "abi3", "--abi", "none",
                    *[a for t in tags for a in ("--platform", t)],
                    "-d", str(dest), "-r", str(reqs)]
            p = subprocess.run(argv, capture_output=True, text=True, check=False)
            if p.returncode != 0:
                raise SystemExit(f"pip download for {arch} failed:\n{p.stderr[-3000:]}")
            for f in dest.iterdir():
                name = canonical(f.name.split("-", 1)[0])
                out[name].add(hashlib.sha256(f.read_bytes()).hexdigest())
    return out


def render(header: list[str], pins: list[tuple[str, str]], found: dict[str, set[str]]) -> str:
    lines = [*header]
    for name, version in pins:
        digests = sorted(found[canonical(name)])
        lines.append(f"{name}=={version} \\")
        lines.extend(f"    --hash=sha256:{d}" + (" \\" if i < len(digests) - 1 else "")
                     for i, d in enumerate(digests))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check every pin has a hash")
    args = parser.parse_args(argv)
    text = REQUIREMENTS.read_text()
    header, pins = parse(text)
    if args.check:
        blocks = re.split(r"\n(?=[A-Za-z])", text)
        bare = [b.split("==")[0] for b in blocks if "==" in b and "--hash=sha256:" not in b]
        if bare:
            print(f"no hash for: {', '.join(bare)}", file=sys.stderr)
            return 1
        return 0
    found = hashes(pins)
    missing = [n for n, _ in pins if not found[canonical(n)]]
    if missing:
        print(f"pip found no file for: {', '.join(missing)}", file=sys.stderr)
        return 1
    REQUIREMENTS.write_text(render(header, pins, found))
    print(f"{REQUIREMENTS}: {len(pins)} pins, "
          f"{sum(len(v) for v in found.values())} hashes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
