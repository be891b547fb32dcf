"""Building blocks of the config loader: strict YAML reading, typed field access, kubelet
settings and the `check-config` command. `cloudscale_autoscaler.config_loader` is the entry point.
"""
