"""deploy/rbac.yaml against the real API server's RBAC: exactly enough, and nothing more.

The ServiceAccount, ClusterRole and ClusterRoleBinding of deploy/ are applied as they are, and
ipvsproxy's own API code (every reflector of `ipvsproxy run`, `sync --once`'s listing) runs with
a token of that account from the TokenRequest API. The server's audit log is the record:
* enough: every request the code made was answered 2xx, never 401 or 403;
* exactly: the (API group, resource, verb) of those requests are the ClusterRole's rules, no
  fewer (nothing granted goes unused) and no more;
* each rule is needed: with the same role less one rule (its own account, token and binding,
  after the authorizer confirms the rest), that very request of the code is refused, 403;
* nothing else: the server lists for the account the role's rules plus what it grants every
  account (what a fresh account with no binding has), and refuses other reads and every write
  with its own 403.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from integration.upstream.client import ApiError
from integration.upstream.controlplane import ControlPlane
from tests.realapi.conftest import SA_USER, Applied, proxy_role, wait_for
from tests.realapi.proxycalls import (
    NODE,
    Rule,
    audited_rules,
    can,
    role_rules,
    run_proxy_calls,
)
from tests.unit.kube_objects import node

ROLE = role_rules(proxy_role())


def rules_review(cp: ControlPlane, token: str) -> set[Rule]:
    got = cp.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": "default"}}, token=token)
    assert not got["status"].get("incomplete")
    return role_rules({"rules": got["status"]["resourceRules"]})


def account(cluster: Applied, name: str, rules: set[Rule] | None) -> str:
    """A ServiceAccount in kube-system (bound to a ClusterRole of `rules` unless None) and a
    token of it, once the authorizer grants every rule."""
    cp = cluster.cp
    objs: list[dict[str, Any]] = [
        {"kind": "ServiceAccount", "metadata": {"name": name, "namespace": "kube-system"}}]
    if rules is not None:
        objs += [
            {"kind": "ClusterRole", "metadata": {"name": name},
             "rules": [{"apiGroups": [g], "resources": [r], "verbs": [v]}
                       for g, r, v in sorted(rules)]},
            {"kind": "ClusterRoleBinding", "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}]}]
    cluster.apply(objs)
    user = f"system:serviceaccount:kube-system:{name}"
    wait_for(f"{name}'s binding to reach the authorizer",
             lambda: all(can(cp, user, r) for r in rules or ()))
    return cp.token("kube-system", name)


def test_the_daemon_and_sync_are_never_refused_and_use_exactly_the_role(
        control_plane: ControlPlane, cluster: Applied, proxy_kubeconfig: Path) -> None:
    cluster.apply(node(NODE))
    before = len(control_plane.audit(SA_USER))
    said = run_proxy_calls(proxy_kubeconfig)
    for kind in ("Service", "EndpointSlice", "Node", "ServiceCIDR"):
        assert said[kind] == [("list", 200), ("watch", 200)], said
    assert isinstance(said["listing"], int), said  # sync --once's listing went through
    used = wait_for("the audit log of those requests",
                    lambda: (got := audited_rules(control_plane, SA_USER, before))
                    and set(got) >= ROLE and got)
    refused = {rule: codes for rule, codes in used.items() if codes != {200}}
    assert not refused, f"the proxy's own requests were refused: {refused}"
    assert set(used) == ROLE, (f"used but not granted: {set(used) - ROLE}; "
                               f"granted but never used: {ROLE - set(used)}")


@pytest.mark.parametrize("missing", sorted(ROLE), ids=lambda r: f"{r[1]}-{r[2]}")
def test_without_any_one_rule_that_request_is_refused(
        control_plane: ControlPlane, cluster: Applied, tmp_path: Path, missing: Rule) -> None:
    cluster.apply(node(NODE))
    name = f"ipvsproxy-without-{missing[1]}-{missing[2]}"
    token = account(cluster, name, ROLE - {missing})
    user = f"system:serviceaccount:kube-system:{name}"
    assert not can(control_plane, user, missing)
    before = len(control_plane.audit(user))
    said = run_proxy_calls(control_plane.kubeconfig(tmp_path / "kubeconfig", token))
    used = wait_for("the audit log of the refusal",
                    lambda: (got := audited_rules(control_plane, user, before))
                    and missing in got and got)
    assert used[missing] == {403}, (used, said)
    # what the role still grants was granted: the one missing rule is the one refusal
    assert all(codes == {200} or rule == missing for rule, codes in used.items()), used


def test_the_server_grants_the_account_the_role_and_only_what_every_account_has(
        control_plane: ControlPlane, cluster: Applied, proxy_token: str) -> None:
    baseline = rules_review(control_plane, account(cluster, "ipvsproxy-test-nobody", None))
    assert rules_review(control_plane, proxy_token) - baseline == ROLE


REFUSED = [
    ("GET", "/api/v1/secrets", "list", "secrets"),
    ("GET", "/api/v1/namespaces/kube-system/secrets/anything", "get", "secrets"),
    ("GET", "/api/v1/pods", "list", "pods"),
    ("GET", "/api/v1/pods?watch=true", "watch", "pods"),
    ("GET", "/api/v1/configmaps", "list", "configmaps"),
    ("GET", "/api/v1/endpoints", "list", "endpoints"),
    ("GET", "/api/v1/namespaces", "list", "namespaces"),
    # a single Service or EndpointSlice is never read: only lists and watches are granted
    ("GET", "/api/v1/namespaces/default/services/kubernetes", "get", "services"),
    ("GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/x", "get",
     "endpointslices"),
    ("POST", "/api/v1/namespaces/default/services", "create", "services"),
    ("DELETE", "/api/v1/namespaces/default/services/kubernetes", "delete", "services"),
    ("PATCH", "/api/v1/namespaces/default/services/kubernetes", "patch", "services"),
    ("PUT", "/api/v1/namespaces/default/services/kubernetes/status", "update",
     "services/status"),
    ("POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", "create",
     "endpointslices"),
    ("PATCH", "/api/v1/nodes/node-a/status", "patch", "nodes/status"),
    ("DELETE", "/api/v1/nodes/node-a", "delete", "nodes"),
    ("POST", "/api/v1/namespaces/kube-system/events", "create", "events"),
    ("POST", "/apis/events.k8s.io/v1/namespaces/kube-system/events", "create", "events"),
    ("POST", "/api/v1/namespaces/kube-system/serviceaccounts/ipvsproxy/token", "create",
     "serviceaccounts/token"),
    ("DELETE", "/apis/networking.k8s.io/v1/servicecidrs/kubernetes", "delete", "servicecidrs"),
]


@pytest.mark.parametrize(("method", "path", "verb", "resource"), REFUSED,
                         ids=[f"{m}-{p}" for m, p, _, _ in REFUSED])
def test_everything_else_is_refused(control_plane: ControlPlane, proxy_token: str, method: str,
                                    path: str, verb: str, resource: str) -> None:
    body: dict[str, Any] | None = {} if method in ("POST", "PUT", "PATCH") else None
    ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
    with pytest.raises(ApiError) as err:
        control_plane.request(method, path, body, token=proxy_token, content_type=ctype)
    assert err.value.status == 403, err.value
    message = err.value.body["message"]
    # the server's own wording, naming the account and what it may not do
    assert f'User "{SA_USER}" cannot {verb} resource "{resource}"' in message, message


def test_a_wrong_token_is_not_authenticated(control_plane: ControlPlane) -> None:
    with pytest.raises(ApiError) as err:
        control_plane.request("GET", "/api/v1/services", token="not-a-token")
    assert err.value.status == 401, err.value
