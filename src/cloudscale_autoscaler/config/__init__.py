"""The configuration: a YAML file read, checked and turned into immutable dataclasses.

`load_config` returns a `Config` or raises `ConfigError` with every problem found, each as
`<path>: <reason>`. This face is what the rest imports; the other types are in `types`. Inside:
`yamlfile` (strict YAML reading), `reader` (typed field access collecting issues), `values`
(pure value checks), one module per section (`groups`, `interfaces`, `kubelet`, `kubernetes`,
`pricing`), `loader` (the top level, TLS files, the API token) and `advice` (warnings about a
valid config). Nothing here talks to a network or to Kubernetes: the checks that do belong to
the commands that run them.
"""

from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.config.types import Config, ConfigError, NodeGroupConfig

__all__ = ["Config", "ConfigError", "NodeGroupConfig", "load_config"]
