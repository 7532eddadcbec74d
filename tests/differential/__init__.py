"""The differential suite: the real kube-proxy --proxy-mode=ipvs as the reference for ipvsproxy.

cluster.py holds what a generated cluster is (the feature tables, `Params`, `Change`,
`Cluster`); generate.py makes seeded clusters (API objects valid for the real API server), on
the generator's model and allocators (model.py) and its EndpointSlices (slices.py), and
changes.py change series on them; features.py reads back which features a cluster covers and
validity.py checks the objects offline; api.py writes them through the API server; snapshot.py
reads, normalizes and compares the kernel state each proxy leaves; deviations.py classifies
every difference against the deviations the README documents; proxies.py runs the node and both
proxies in the lab guest, and run.py drives them cluster by cluster
(tests/kernel/test_differential.py, and `make conformance` at full size).
"""
