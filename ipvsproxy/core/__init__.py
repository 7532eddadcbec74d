"""The pure core: types, desired state, diff and renderers. No sockets, subprocesses or clocks."""
