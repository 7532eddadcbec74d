"""Objects read from files: `kubectl get ... -o yaml|json` dumps and manifests (manifests.py),
the fast reader of the YAML kubectl writes (kubeyaml.py, kubeyaml_scalars.py) and what kubectl
means by a YAML text (kubectl_yaml.py)."""
