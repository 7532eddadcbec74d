"""The API server's validation rules for the fields that reach the dataplane, and safe printing.

Objects reach ipvsproxy from the API server, which validates them, but also from files
(`--from-file`) and from controllers with bugs: every input gets the checks the API server would
make on the fields ipvsproxy uses (k8s.io/kubernetes pkg/apis/core/validation and
pkg/apis/discovery/validation; shared/reference/kube-proxy-ipvs.md §4), so a file can never
program what a cluster could not hold. Pure; no regular expressions (model.py parses every watch
event through here).
"""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

IPAddress = IPv4Address | IPv6Address

_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


def special_address(a: IPAddress) -> str:
    """Why `a` may not be an endpoint or an external address ("" when it may).

    ValidateEndpointIP and ValidateNonSpecialIP refuse unspecified, loopback, link-local and
    link-local multicast addresses: traffic for them never leaves the node (or this link), so a
    Service pointing there reaches the node itself (169.254.169.254 is the cloud metadata
    server). ipvsproxy refuses every multicast address, not only link-local ones: IPVS cannot
    balance a multicast destination either."""
    if a.__class__ is IPv4Address:  # the common case, without ipaddress's network lookups
        n = int(a)
        return ("unspecified" if n == 0 else "loopback" if n >> 24 == 127
                else "link-local" if n >> 16 == 0xA9FE else "multicast" if n >> 28 == 0xE
                else "")
    if a.is_unspecified:
        return "unspecified"
    if a.is_loopback:
        return "loopback"
    if a.is_link_local:
        return "link-local"
    if a.is_multicast:
        return "multicast"
    return ""


def refusal(why: str, what: str) -> str:
    """`why` (from special_address) as a message says it. The API server lets multicast
    addresses other than link-local ones in; IPVS cannot serve any."""
    who = "ipvsproxy refuses (IPVS cannot serve it)" if why == "multicast" \
        else "the API server refuses"
    return f"{why}, which {who} for {what}"


def is_dns_label(s: str) -> bool:
    """RFC 1123 label (IsDNS1123Label): what Service and EndpointSlice port names must be."""
    return (0 < len(s) <= 63 and s[0] in _ALNUM and s[-1] in _ALNUM
            and _LABEL_CHARS.issuperset(s))


def is_dns1035_label(s: str) -> bool:
    """RFC 1035 label (IsDNS1035Label): what a Service's name must be (it starts with a letter)."""
    return is_dns_label(s) and s[0].isalpha()


def is_dns_subdomain(s: str) -> bool:
    """RFC 1123 subdomain (IsDNS1123Subdomain): EndpointSlice and Node names."""
    return 0 < len(s) <= 253 and all(is_dns_label(p) for p in s.split("."))


def printable(text: str) -> str:
    """`text` with control and other non-printable characters escaped (as repr escapes them):
    names and values from objects reach log lines and rendered plans, where a newline would
    forge a line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
