"""The proxy's settings: the flags as one frozen value (config.py) and kube-proxy's
KubeProxyConfiguration file read into them (kpconfig.py, its schema as tables in kpschema.py)."""
