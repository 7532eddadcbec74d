"""The proxies installed in the lab guest as a node has them (issue 33's side-by-side bench and
cold-node profile, in the guest).

The guest's root is the host's over 9p, where every file access is an emulated round trip of
3-10 ms (integration/vm/lab.py, NODE_LIKE_ETC). A Python program opens and stats its modules
one by one: `ipvsproxy run` makes ~1,900 file system calls before its first list (strace on the
host), each a round trip here, and reads ~330 modules' byte code through it. kube-proxy is one
Go binary, read once. On a node neither pays that: the image's files sit on a local disk and,
after the first start, in the page cache. So each proxy is copied into the guest's tmpfs as its
image puts it on a node: for ipvsproxy the interpreter's standard library, the distributions
ipvsproxy requires (their files as pip installed them) and the ipvsproxy package, byte-compiled;
for kube-proxy its binary. The interpreter's own binary, the kernel and the tools both proxies
run (ipset, iptables, nft) stay where they are, the same for both.

`profile_cold.py` times the start both ways (the figures in docs/benchmarks.md).
"""

from __future__ import annotations

import compileall
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the parts of the standard library no daemon imports (a third of its files: tests, GUI)
STDLIB_SKIP = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data")


@dataclass(frozen=True)
class Installed:
    root: Path
    python: Path  # the interpreter binary (where it is: one file, as kube-proxy's)
    env: dict[str, str]  # what makes it import from root only

    def ipvsproxy(self) -> list[str]:
        """argv of the `ipvsproxy` command, installed here."""
        return [str(self.python), str(self.root / "bin" / "ipvsproxy")]

    def kube_proxy(self) -> str:
        return str(self.root / "bin" / "kube-proxy")


def runtime_distributions(name: str = "ipvsproxy") -> list[metadata.Distribution]:
    """`name`'s requirements, and theirs, without extras: what `pip install name` installs."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        want = todo.pop()
        for req in metadata.requires(want) or []:
            if "extra ==" in req:
                continue
            m = re.match(r"[A-Za-z0-9._-]+", req)
            if m is None:
                continue
            key = m.group(0).lower().replace("_", "-")
            if key in seen:
                continue
            try:
                seen[key] = metadata.distribution(m.group(0))
            except metadata.PackageNotFoundError:  # a marker excluded it here (python_version)
                continue
            todo.append(m.group(0))
    return list(seen.values())


def install(root: Path, kube_proxy: Path | None = None) -> Installed:
    if root.exists():
        shutil.rmtree(root)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lib = root / "lib" / stdlib.name
    shutil.copytree(stdlib, lib, symlinks=True, ignore=shutil.ignore_patterns(*STDLIB_SKIP))
    site = root / "site"
    for dist in runtime_distributions():
        for f in dist.files or []:
            if f.parts and f.parts[0] == "..":  # console scripts: not used
                continue
            src = Path(str(dist.locate_file(f)))
            if src.is_file():
                (site / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, site / f)
    app = root / "app"
    shutil.copytree(ROOT / "ipvsproxy", app / "ipvsproxy",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "bin").mkdir()
    script = root / "bin" / "ipvsproxy"
    # the console script pip writes (ipvsproxy.cli:entry)
    script.write_text("import re\nimport sys\nfrom ipvsproxy.cli import entry\n"
                      "if __name__ == '__main__':\n"
                      "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
                      "    sys.exit(entry())\n")
    if kube_proxy is not None:
        shutil.copy2(kube_proxy, root / "bin" / "kube-proxy")
    compileall.compile_dir(str(site), quiet=1, workers=1)
    compileall.compile_dir(str(app), quiet=1, workers=1)
    python = Path(os.path.realpath(sys.executable))
    env = {**os.environ, "PYTHONHOME": str(root), "PYTHONPATH": f"{app}:{site}",
           "PYTHONNOUSERSITE": "1"}
    env.pop("VIRTUAL_ENV", None)
    inst = Installed(root, python, env)
    check(inst)
    return inst


def check(inst: Installed) -> None:
    """Every module the daemon imports comes from the copy (none from the 9p tree)."""
    code = ("import sys, ipvsproxy.commands.run, ipvsproxy.daemon.reconciler, "
            "ipvsproxy.daemon.metrics, ipvsproxy.kube.reflector, ipvsproxy.kernel.dataplane; "
            "print('\\n'.join(sorted({getattr(m, '__file__', None) or '' "
            "for m in sys.modules.values()} - {''})))")
    p = subprocess.run([str(inst.python), "-P", "-c", code], env=inst.env, capture_output=True,
                       text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"the node-like install does not import: {p.stderr[-1500:]}")
    outside = [f for f in p.stdout.split() if not f.startswith(str(inst.root))]
    if outside:
        raise RuntimeError(f"the node-like install imports from outside it: {outside[:5]}")
