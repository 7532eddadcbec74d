"""deploy/, the image and the kind overlay, checked offline.

* Every manifest in deploy/ (and integration/kind/workload.yaml) is valid against the Kubernetes
  OpenAPI schemas (kubernetes-validate, strict: an unknown or misspelt field fails), and so is
  what `kubectl kustomize` renders from deploy/ and from the kind overlay.
* The RBAC grants exactly the verbs the code uses. The list is derived from the code, in two
  ways that must agree: statically, every kubernetes client API method ipvsproxy's source refers
  to, with the HTTP method and path the client sends it as; and by running the code, the daemon's
  reflectors and `sync`'s listing, against the fake API server (tests/apiserver.py) and reading
  what it was asked. A list method used with watch=True is seen only in the second way.
* The DaemonSet runs flags `ipvsproxy run` accepts, with a config file it reads without a
  warning, probes where that file makes it listen, and the node settings the deployment needs.
* The image: what the Dockerfile copies is in the build context .dockerignore allows, and
  deploy/requirements.txt pins what pyproject.toml pins, plus everything those pull in.
* shellcheck finds nothing in any shell script of the repository.
"""

from __future__ import annotations

import ast
import configparser
import fnmatch
import importlib.metadata
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement

# The request -> (group, resource, verb) mapping is the fake API server's, which enforces it.
from tests.apiserver import Rule, rbac_rule, rules_of

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KIND = ROOT / "integration" / "kind"
# The oldest Kubernetes release whose schemas are checked, and the newest kubernetes-validate has.
SCHEMA_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
NAMESPACE = "kube-system"

Doc = dict[str, Any]


# ------------------------------------------------------------------------------------- helpers


def load_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def kubectl() -> str:
    path = shutil.which("kubectl")
    # Not a skip: a missing kubectl is a broken machine (make host-packages installs it).
    assert path, "kubectl is not installed; `make host-packages` installs it"
    return path


def kustomize(directory: Path) -> list[Doc]:
    p = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True,
                       timeout=120, check=False)
    version = subprocess.run([kubectl(), "version", "--client"], capture_output=True, text=True,
                             check=False).stdout.strip()
    assert p.returncode == 0, f"kubectl kustomize {directory} failed ({version}):\n{p.stderr}"
    return [d for d in yaml.safe_load_all(p.stdout) if d is not None]


def schema_errors(doc: Doc) -> list[str]:
    out = []
    for version in SCHEMA_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            out.append(f"{doc.get('kind')} {doc.get('metadata', {}).get('name')} "
                       f"(Kubernetes {version}) at {where or '.'}: {exc.message}")
    return out


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[d['kind'] for d in docs]}"
    return found[0]


def container(ds: Doc) -> Doc:
    containers = ds["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c: Doc = containers[0]
    return c


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    return kustomize(DEPLOY)


def manifests() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*.yaml") if p.name != "kustomization.yaml")


# ----------------------------------------------------------------------------- the schemas


def test_every_manifest_in_deploy_is_valid_against_the_api_schemas() -> None:
    files = [*manifests(), KIND / "workload.yaml"]
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"deploy/rbac.yaml", "deploy/daemonset.yaml", "deploy/migrate/ipvsproxy-records.yaml",
            "deploy/migrate/ipvsproxy-cleanup.yaml"} <= names
    errors = []
    for path in files:
        docs = load_docs(path)
        assert docs, f"{path} holds no manifest"
        for doc in docs:
            errors += [f"{path.relative_to(ROOT)}: {e}" for e in schema_errors(doc)]
    assert not errors, "\n".join(errors)


def test_the_validator_refuses_a_misspelt_field() -> None:
    """The check above can fail: strict validation catches a typo in a nested field."""
    ds = one(load_docs(DEPLOY / "daemonset.yaml"), "DaemonSet")
    container(ds)["imagePullPolicyy"] = "IfNotPresent"
    assert schema_errors(ds)


def test_kubectl_kustomize_renders_deploy(rendered: list[Doc]) -> None:
    assert sorted(d["kind"] for d in rendered) == [
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
    errors = [e for d in rendered for e in schema_errors(d)]
    assert not errors, "\n".join(errors)
    for d in rendered:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == NAMESPACE, d["metadata"]
    # the generated ConfigMap (its name carries a hash) is the one the DaemonSet mounts
    cm = one(rendered, "ConfigMap")
    assert cm["metadata"]["name"].startswith("ipvsproxy-config-")
    assert cm["data"]["config.conf"] == (DEPLOY / "config.conf").read_text(encoding="utf-8")
    ds = one(rendered, "DaemonSet", "ipvsproxy")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    # the image built from this checkout, in whatever registry kustomization.yaml names
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert re.fullmatch(rf"(\S+/)?ipvsproxy:{re.escape(version)}", container(ds)["image"])


def test_kubectl_kustomize_renders_the_kind_overlay() -> None:
    docs = kustomize(KIND)
    errors = [e for d in docs for e in schema_errors(d)]
    assert not errors, "\n".join(errors)
    e2e = (KIND / "e2e.sh").read_text(encoding="utf-8")
    cluster = re.search(r"^cluster=(\S+)$", e2e, re.M)
    image = re.search(r"^image=(\S+)$", e2e, re.M)
    assert cluster and image
    ds = one(docs, "DaemonSet", "ipvsproxy")
    assert container(ds)["image"] == image[1]  # the image e2e.sh builds and loads
    api = one(docs, "ConfigMap", "ipvsproxy-apiserver")
    assert api["metadata"]["namespace"] == NAMESPACE
    # kind names the control-plane node (and the host name in the API server's certificate)
    assert api["data"] == {"KUBERNETES_SERVICE_HOST": f"{cluster[1]}-control-plane",
                           "KUBERNETES_SERVICE_PORT": "6443"}
    assert container(ds)["envFrom"] == [{"configMapRef": {"name": "ipvsproxy-apiserver"}}]


# ---------------------------------------------------------------------------------- the RBAC

def test_rbac_rule_of_a_request() -> None:
    assert rbac_rule("GET", "/api/v1/services?limit=500") == ("", "services", "list")
    assert rbac_rule("GET", "/api/v1/nodes?fieldSelector=metadata.name%3Da&watch=True") == (
        "", "nodes", "watch")
    assert rbac_rule("GET", "/api/v1/nodes/{name}") == ("", "nodes", "get")
    assert rbac_rule("GET", "/apis/discovery.k8s.io/v1/endpointslices") == (
        "discovery.k8s.io", "endpointslices", "list")
    assert rbac_rule("POST", "/api/v1/namespaces/{namespace}/events") == ("", "events", "create")
    assert rbac_rule("PATCH", "/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}") == (
        "events.k8s.io", "events", "patch")
    assert rbac_rule("PUT", "/api/v1/nodes/{name}/status") == ("", "nodes/status", "update")
    assert rbac_rule("GET", "/apis") is None and rbac_rule("GET", "/version") is None


# What may stand between ipvsproxy and the API server. Anything else (the dynamic client, raw
# requests) would hide API calls from the scan below, which would then have to learn about it.
_KUBERNETES_IMPORTS = {"kubernetes.client", "kubernetes.config", "kubernetes.client.exceptions",
                       "kubernetes.watch.watch"}


def _sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((ROOT / "ipvsproxy").rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def api_calls_in_source() -> dict[str, Rule]:
    """Every request ipvsproxy's source can make, with the rule it is authorized as. All of
    them are `rest.Get(api, rest.<PATH>)` (kube/rest.py; a list, or a get with a name in the
    path); the source names no generated API class of the client, whose calls this scan would
    not see."""
    from kubernetes import client

    from ipvsproxy.kube import rest

    calls: dict[str, Rule] = {}
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kubernetes"):
                module = node.module or ""
                names = {f"{module}.{a.name}" for a in node.names}
                assert module in _KUBERNETES_IMPORTS or names <= _KUBERNETES_IMPORTS, (
                    f"{path}: from {module} import ...: teach this test what it calls")
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("kubernetes") for a in node.names), path
            name = node.attr if isinstance(node, ast.Attribute) else (
                node.id if isinstance(node, ast.Name) else None)
            assert not (name and name.endswith("Api") and isinstance(
                vars(client).get(name) or getattr(client, name, None), type)), (
                f"{path}: {name}: requests go through kube/rest.py")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("rest.Get", "Get"):
                where = node.args[1] if len(node.args) > 1 else None
                assert isinstance(where, ast.Attribute) and ast.unparse(where.value) == "rest", (
                    f"{path}:{node.lineno}: the path of a Get is one of rest's constants")
                rule = rbac_rule("GET", getattr(rest, where.attr))
                assert rule is not None
                calls[where.attr] = rule
    assert calls, "the scan found no request in ipvsproxy/"
    return calls


def rules_seen_by_the_api_server() -> set[Rule]:
    """Run the daemon's reflectors and `sync`'s listing against the fake API server and return
    the rules of the requests it received."""
    from kubernetes.client import ApiClient, Configuration

    from ipvsproxy.kube.listing import list_objects
    from ipvsproxy.kube.reflector import start_reflectors
    from tests.apiserver import ApiServer
    from tests.unit.kube_objects import NODE, ep, node, service, slice_

    class Sink:
        def list_page(self, kind: str, items: list[dict[str, Any]], first: bool) -> None:
            pass

        def list_done(self, kind: str) -> None:
            pass

        def event(self, kind: str, type_: str, obj: dict[str, Any]) -> None:
            pass

    server = ApiServer()
    server.start()
    api: Any = ApiClient(Configuration(host=server.url))
    try:
        server.load([service("a", "10.96.0.1"), slice_("a", ep("10.244.1.1")), node()])
        stop = threading.Event()
        threads = start_reflectors(api, NODE, Sink(), stop, min_watch_timeout=1,
                                   max_watch_timeout=2, socket_timeout=2, connect_timeout=1,
                                   backoff_initial=0.05, backoff_max=0.2)
        deadline = time.monotonic() + 10
        while len({r[:2] for m, p in list(server.requests)
                   if (r := rbac_rule(m, p)) and r[2] == "watch"}) < len(threads):
            assert time.monotonic() < deadline, f"not every kind watched: {server.requests}"
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join(5)
        list_objects(api, NODE)  # `ipvsproxy sync --once` without --from-file
    finally:
        api.close()
        server.stop()
    return {r for method, path in server.requests if (r := rbac_rule(method, path))}


def rbac_rules(docs: list[Doc]) -> set[Rule]:
    role = one(docs, "ClusterRole", "ipvsproxy")
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames etc.
    return rules_of(role)


def test_the_rbac_grants_exactly_the_verbs_the_code_uses(rendered: list[Doc]) -> None:
    static = api_calls_in_source()
    seen = rules_seen_by_the_api_server()
    # Running the code exercised every API call the source names, and nothing else...
    assert set(static.values()) <= seen, (static, seen)
    assert {(g, r, v if v != "watch" else "list") for g, r, v in seen} <= set(static.values())
    # ...and what it needs is what the ClusterRole grants: no more, no less.
    assert rbac_rules(rendered) == seen
    # the derivation found what the reading of the code says
    assert seen == {("", "services", "list"), ("", "services", "watch"),
                    ("discovery.k8s.io", "endpointslices", "list"),
                    ("discovery.k8s.io", "endpointslices", "watch"),
                    ("", "nodes", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),
                    ("networking.k8s.io", "servicecidrs", "list"),
                    ("networking.k8s.io", "servicecidrs", "watch")}


def test_the_rbac_binds_the_daemonsets_service_account(rendered: list[Doc]) -> None:
    ds = one(rendered, "DaemonSet", "ipvsproxy")
    sa = one(rendered, "ServiceAccount")
    binding = one(rendered, "ClusterRoleBinding", "ipvsproxy")
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "ipvsproxy"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]


# ----------------------------------------------------------------------------- the DaemonSet


def run_args(ds: Doc) -> list[str]:
    c = container(ds)
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    return [a.replace("$(NODE_NAME)", "node-a") for a in c["args"]]


def test_the_daemonset_runs_flags_ipvsproxy_run_accepts_with_its_config(
        rendered: list[Doc], tmp_path: Path) -> None:
    from ipvsproxy.cli import build_parser
    from ipvsproxy.commands.run import _config

    ds = one(rendered, "DaemonSet", "ipvsproxy")
    argv = run_args(ds)
    assert argv[0] == "run" and "--hostname-override=node-a" in argv
    # the config file is where the DaemonSet mounts the ConfigMap's key
    (path,) = [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    assert Path(path).parent == Path(mounts["config"]["mountPath"])
    cm = one(rendered, "ConfigMap")
    assert Path(path).name in cm["data"]
    conf = tmp_path / Path(path).name
    conf.write_text(cm["data"][conf.name], encoding="utf-8")
    argv = [a if not a.startswith("--config=") else f"--config={conf}" for a in argv]
    args = build_parser("run").parse_args(argv)  # exits (SystemExit) on an unknown flag
    args.argv = argv
    cfg = _config(args)
    assert cfg.hostname == "node-a"  # the flag, from the downward API
    # and the rest from the file
    file = yaml.safe_load(cm["data"][conf.name])
    assert ",".join(str(n) for n in cfg.cluster_cidrs) == file["clusterCIDR"]
    assert cfg.healthz_bind_address == "0.0.0.0:10256"


def test_the_config_file_is_read_without_a_warning() -> None:
    from ipvsproxy.settings.kpconfig import defaults_from_file

    values, warnings = defaults_from_file(str(DEPLOY / "config.conf"))
    assert warnings == []
    assert values["cluster_cidr"] == "10.244.0.0/16"
    kind = load_docs(KIND / "kind-config.yaml")[0]
    assert kind["networking"]["podSubnet"] == values["cluster_cidr"]


def test_the_daemonset_settings_a_node_proxy_needs(rendered: list[Doc]) -> None:
    from ipvsproxy.settings.kpconfig import defaults_from_file

    ds = one(rendered, "DaemonSet", "ipvsproxy")
    pod = ds["spec"]["template"]["spec"]
    c = container(ds)
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1}}
    # Issue 32, item 12: only the init container that writes the sysctls is privileged; the
    # proxy has NET_ADMIN and NET_RAW and nothing else (why: the comments in daemonset.yaml;
    # measured on the e2e node, docs/e2e.md)
    assert c["securityContext"] == {"privileged": False, "capabilities": {
        "drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}}
    (init,) = pod["initContainers"]
    assert init["securityContext"] == {"privileged": True}
    assert init["image"] == c["image"] and init["env"] == c["env"]
    # the same configuration; the takeover is the daemon's business, not the sysctls'
    assert init["args"] == [c["args"][0], "--sysctls-only",
                            *(a for a in c["args"][1:] if a != "--adopt-kube-proxy")]
    assert "envFrom" not in init  # it never talks to the API server
    assert {m["mountPath"] for m in init["volumeMounts"]} == {"/etc/ipvsproxy",
                                                              "/run/xtables.lock"}
    # probes where the config makes the daemon listen
    values, _ = defaults_from_file(str(DEPLOY / "config.conf"))
    port = int(str(values["healthz_bind_address"]).rsplit(":", 1)[1])
    probes = {k: c[k]["httpGet"] for k in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes == {"livenessProbe": {"path": "/livez", "port": port},
                      "readinessProbe": {"path": "/healthz", "port": port},
                      "startupProbe": {"path": "/livez", "port": port}}
    assert c["ports"] == [{"name": "healthz", "containerPort": port, "protocol": "TCP"}]
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"memory": "256Mi"}}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/lib/modules"]["readOnly"] is True
    assert volumes[mounts["/lib/modules"]["name"]]["hostPath"]["path"] == "/lib/modules"
    assert not mounts["/run/xtables.lock"].get("readOnly")
    assert volumes[mounts["/run/xtables.lock"]["name"]]["hostPath"] == {
        "path": "/run/xtables.lock", "type": "FileOrCreate"}
    assert c["envFrom"] == [{"configMapRef": {"name": "ipvsproxy-apiserver"}}]


def test_the_daemonset_routes_are_the_daemons() -> None:
    """/livez and /healthz are what daemon/http.py serves on --healthz-bind-address."""
    src = (ROOT / "ipvsproxy" / "daemon" / "http.py").read_text(encoding="utf-8")
    assert re.search(r'routes = \{"/healthz": .*\n\s*"/livez": ', src)


def test_the_readmes_sed_commands_each_change_one_line() -> None:
    """The READMEs put the registry and the images in with sed: each pattern matches once."""
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    top = (ROOT / "README.md").read_text(encoding="utf-8")
    section = top[top.index("## Run it on a cluster"):]
    section = section[:section.index("\n## ", 1)]
    for file, pattern in (("migrate/ipvsproxy-records.yaml", r"image: ipvsproxy:.*"),
                          ("kustomization.yaml", r"newName: ipvsproxy$")):
        text = (DEPLOY / file).read_text(encoding="utf-8")
        assert len(re.findall(rf"^\s*{pattern}", text, re.M)) == 1, file
        assert f"s|{pattern}|" in readme, file
        if not file.startswith("migrate/"):  # the section has no way back
            assert f"s|{pattern}|" in section, file


# ---------------------------------------------------------------------------------- the image


def dockerignore_allows(path: str, patterns: list[str]) -> bool:
    """Docker's rule for a path in the build context: the last pattern that matches it, or one
    of its parent folders, decides; `!` lets it in again. `**` matches any number of folders."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    allowed = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        regex = fnmatch.translate(glob).replace(".*.*/", "(.*/)?")
        if any(re.match(regex, p) for p in prefixes):
            allowed = negated
    return allowed


def test_what_the_dockerfile_copies_is_in_the_build_context() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    copies = [shlex.split(line)[1:-1] for line in dockerfile.splitlines()
              if line.startswith("COPY ")]
    sources = [s for srcs in copies for s in srcs if not s.startswith("--")]
    assert {"deploy/requirements.txt", "ipvsproxy", "scheduler",
            "deploy/entrypoint.sh"} <= set(sources)
    for src in sources:
        assert (ROOT / src).exists(), src
        files = [src] if (ROOT / src).is_file() else [
            p.relative_to(ROOT).as_posix() for p in (ROOT / src).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]
        assert files and all(dockerignore_allows(f, patterns) for f in files), src
    for outside in (".venv/bin/python", ".git/HEAD", "tests/unit/test_deploy.py",
                    "ipvsproxy/__pycache__/cli.cpython-311.pyc", "bench/kernel_bench.py"):
        assert not dockerignore_allows(outside, patterns), outside
    # the entrypoint the image runs is the script copied in, and it execs ipvsproxy
    entrypoint = re.search(r'^ENTRYPOINT \["([^"]+)", "ipvsproxy"\]$', dockerfile, re.M)
    assert entrypoint and f"COPY deploy/entrypoint.sh {entrypoint[1]}\n" in dockerfile
    apt = re.search(r"--no-install-recommends ([^\\\n]+)", dockerfile)
    assert apt and {"ipset", "iptables", "ipvsadm"} <= set(apt[1].split())


def test_the_package_as_the_image_copies_it_installs_the_ipvsproxy_command(
        tmp_path: Path) -> None:
    """`pip install --no-deps /src` of what the Dockerfile copies to /src: the wheel holds the
    package and the `ipvsproxy` command (pyproject.toml [project.scripts]), whose function is
    the one `python -m ipvsproxy` runs."""
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    src = tmp_path / "src"
    for line in dockerfile.splitlines():
        parts = shlex.split(line) if line.startswith("COPY ") else []
        if parts and parts[-1].startswith("/src/"):
            dest = src / parts[-1].removeprefix("/src/")
            for one in parts[1:-1]:
                target = dest / Path(one).name if parts[-1].endswith("/") else dest
                if (ROOT / one).is_dir():
                    shutil.copytree(ROOT / one, target,
                                    ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(ROOT / one, target)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                            "--disable-pip-version-check", "-w", str(tmp_path / "out"),
                            str(src)], timeout=300, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("ipvsproxy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "ipvsproxy/cli.py" in names and "scheduler/__init__.py" in names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = configparser.ConfigParser()
    scripts.read_string(zipfile.ZipFile(wheel).read(entry_points).decode())
    assert dict(scripts["console_scripts"]) == {"ipvsproxy": "ipvsproxy.cli:entry"}
    main = (ROOT / "ipvsproxy" / "__main__.py").read_text(encoding="utf-8")
    assert "from ipvsproxy.cli import entry" in main


def test_the_image_installs_its_requirements_by_hash_and_its_base_by_digest() -> None:
    """Issue 32, item 12: every pin carries the sha256 of its files and the Dockerfile makes pip
    check them; the build backend is among them (no build isolation fetching an unpinned
    setuptools); the default base is pinned by digest, and only the base is an argument."""
    from integration.node.lock import main as lock

    text = (DEPLOY / "requirements.txt").read_text(encoding="utf-8")
    assert lock(["--check"]) == 0
    for block in re.split(r"\n(?=[A-Za-z])", text):
        if "==" in block:
            assert re.search(r"--hash=sha256:[0-9a-f]{64}", block), block
    assert re.search(r"^setuptools==", text, re.M)
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "pip install --require-hashes -r /tmp/requirements.txt" in dockerfile
    assert "pip install --no-deps --no-build-isolation /src" in dockerfile
    base = re.search(r"^ARG BASE=(\S+)$", dockerfile, re.M)
    assert base and re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base[1])
    froms = re.findall(r"^FROM (.+)$", dockerfile, re.M)
    assert froms == ["${BASE}"]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_image_requirements_pin_pyprojects_pins_and_what_they_pull_in() -> None:
    pins: dict[str, str] = {}
    for line in (DEPLOY / "requirements.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#") and not line.strip().startswith("--hash"):
            name, sep, version = line.strip().removesuffix("\\").strip().partition("==")
            assert sep and version and re.fullmatch(r"[\w.]+", version), f"not pinned: {line}"
            pins[_canonical(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        (spec,) = req.specifier
        assert spec.operator == "=="
        assert pins.get(_canonical(req.name)) == spec.version, dep
    # What each pinned package requires is pinned too, for the image's Python and platform
    # (checked against the installed package's metadata where the same version is installed).
    env = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "extra": ""}
    checked = 0
    for name, version in pins.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked += 1
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                assert _canonical(req.name) in pins, f"{name} needs {text}"
    assert checked >= len(project["dependencies"])


# ------------------------------------------------------------------------------- shellcheck


def shell_scripts() -> list[str]:
    """Every shell script in the checkout, tracked or not yet: *.sh and files whose first line
    names sh, bash or dash."""
    p = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    out = []
    for name in sorted(set(filter(None, p.stdout.split("\0")))):
        path = ROOT / name
        if not path.is_file():
            continue
        if name.endswith(".sh"):
            out.append(name)
            continue
        with path.open("rb") as f:
            first = f.readline(200)
        if re.match(rb"#!\s*\S*(/|env\s+)(ba|da)?sh\b", first):
            out.append(name)
    return out


def test_shellcheck_finds_nothing_in_any_shell_script() -> None:
    scripts = shell_scripts()
    assert {".ci/run", "deploy/entrypoint.sh", "integration/kind/e2e.sh",
            "integration/kind/lib.sh", "integration/vm/install-host-packages.sh"} <= set(scripts)
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed; `make host-packages` installs it"
    # -x follows `source` (e2e.sh's lib.sh), paths as written from the top of the checkout
    p = subprocess.run([shellcheck, "-x", "--severity=style", *scripts], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
