"""IPVS operations as the ipvsadm command that does the same (for `sync --dry-run`). Pure.

Reuses the ipvsadm save-format renderer (`ipvsadm -Sn` lines are ipvsadm arguments), so a dry
run prints what `ipvsadm -R` would accept.
"""

from __future__ import annotations

from ipvsproxy.core.ipvs import IpvsOp, ObservedDest, ObservedService, OpKind
from ipvsproxy.core.ipvsadm_format import (
    FMT_NUMERIC,
    FMT_RULE,
    NO_RESOLVER,
    _dest_line,
    _service_line,
    service_name,
)

_FMT = FMT_RULE | FMT_NUMERIC


def op_line(op: IpvsOp) -> str:
    if op.kind in (OpKind.ZERO, OpKind.FLUSH, OpKind.SET_TIMEOUTS):
        t = op.timeouts
        return {OpKind.ZERO: "ipvsadm -Z", OpKind.FLUSH: "ipvsadm -C"}.get(
            op.kind, f"ipvsadm --set {t.tcp} {t.tcp_fin} {t.udp}" if t else "ipvsadm --set")
    assert op.service is not None
    name = service_name(op.service.key, _FMT)
    if op.kind is OpKind.DEL_SERVICE:
        return f"ipvsadm -D {name}"
    if op.kind in (OpKind.ADD_SERVICE, OpKind.EDIT_SERVICE):
        line = _service_line(ObservedService(op.service), name, _FMT)
        return "ipvsadm " + ("-A" if op.kind is OpKind.ADD_SERVICE else "-E") + line[2:]
    assert op.dest is not None
    if op.kind is OpKind.DEL_DEST:
        return f"ipvsadm -d {name} -r {op.dest.key}"
    line = _dest_line(name, ObservedDest(op.dest), op.service.key.protocol, _FMT, NO_RESOLVER)
    line += (f" -x {op.dest.u_threshold}" if op.dest.u_threshold else "") + \
        (f" -y {op.dest.l_threshold}" if op.dest.l_threshold else "")
    return "ipvsadm " + ("-a" if op.kind is OpKind.ADD_DEST else "-e") + line[2:]
