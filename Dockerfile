# The ipvsproxy image, built from the top of the checkout:
#
#     docker build -t ipvsproxy:0.1.0 .
#
# The image is the `ipvsproxy` command: `docker run ... IMAGE ls -Ln` runs `ipvsproxy ls -Ln`.
# deploy/daemonset.yaml runs it as `ipvsproxy run`, as root, privileged (the comment there says
# why). Only the files .dockerignore lets through are in the build context.
#
# The base is python:3.11-slim-bookworm, pinned by digest: a rebuild gets the same base until
# someone moves the pin (`skopeo inspect --format '{{.Digest}}'
# docker://docker.io/library/python:3.11-slim-bookworm` names the tag's current one). BASE
# replaces it: `make e2e` builds this file with podman's sibling buildah on a base made here
# (integration/node/images.py: debootstrap of bookworm plus Debian's python3 and pip), since
# no registry is reachable where the tests run.
ARG BASE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b
FROM ${BASE}

# The node tools ipvsproxy runs: ipset (`ipset save` / `ipset restore` for set members) and
# iptables (iptables-save / iptables-restore, IPv4 and IPv6). Debian's iptables package has both
# backends, iptables-nft and iptables-legacy; the entrypoint selects the one the node uses.
# ipvsadm is for operators (`kubectl exec ... -- ipvsadm -Ln`, next to `ipvsproxy ls`).
# kmod's modprobe, with the node's /lib/modules mounted, is for iptables-legacy (which runs
# modprobe ip_tables itself when that module is missing) and for operators; ipvsproxy loads no
# modules (the kernel loads ip_vs, its schedulers and the ipset types on first use).
# No conntrack tool: ipvsproxy deletes stale UDP flows over netlink (ipvsproxy/kernel/conntrack.py).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ipset iptables ipvsadm kmod \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Every Python dependency pinned by version and hash (deploy/requirements.txt), in a layer of
# its own that a change to ipvsproxy's code does not rebuild: pip refuses a file whose hash is
# not listed and a package that is not. Then the package itself, without touching them, built
# with the setuptools installed from that list (no build isolation: nothing else is fetched).
COPY deploy/requirements.txt /tmp/requirements.txt
RUN pip install --require-hashes -r /tmp/requirements.txt && rm /tmp/requirements.txt

COPY pyproject.toml README.md /src/
COPY ipvsproxy /src/ipvsproxy
COPY scheduler /src/scheduler
RUN pip install --no-deps --no-build-isolation /src && rm -rf /src

COPY deploy/entrypoint.sh /usr/local/bin/ipvsproxy-entrypoint
RUN chmod 0755 /usr/local/bin/ipvsproxy-entrypoint

# root: IPVS, ipsets, iptables, addresses and sysctls are the node's, and only root may change
# them. The capabilities it gets are the DaemonSet's business (deploy/daemonset.yaml).
USER 0
ENTRYPOINT ["/usr/local/bin/ipvsproxy-entrypoint", "ipvsproxy"]
CMD ["--help"]
