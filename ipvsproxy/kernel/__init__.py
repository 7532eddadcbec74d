"""The only modules that talk to the kernel: IPVS over generic netlink, links, ipsets, iptables."""
