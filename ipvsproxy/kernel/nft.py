"""kube-proxy's nftables tables, through the standard tool: which exist (`nft list tables`) and
their deletion in one transaction (`nft -f -`). Only a takeover from kube-proxy's nftables mode
uses this (core/takeover.py); ipvsproxy programs nothing in nftables itself."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

from ipvsproxy.core.takeover import NFT_TABLES


class NftError(Exception):
    """nft failed; the message carries its stderr."""


def kube_proxy_tables() -> frozenset[str]:
    """Which of kube-proxy's tables ("ip kube-proxy", "ip6 kube-proxy") exist. None can when
    the node has no nft tool: kube-proxy's nftables mode needs it too."""
    if shutil.which("nft") is None:
        return frozenset()
    p = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise NftError(f"nft list tables: {p.stderr.strip()}")
    found = {line.removeprefix("table ").strip() for line in p.stdout.splitlines()}
    return frozenset(t for t in NFT_TABLES if t in found)


def delete_tables(tables: Iterable[str]) -> None:
    """Delete the tables in one nft transaction: all of them, or none."""
    script = "".join(f"delete table {t}\n" for t in tables)
    p = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True,
                       check=False)
    if p.returncode != 0:
        raise NftError(f"nft -f -: {p.stderr.strip()}")
