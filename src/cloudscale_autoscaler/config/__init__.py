"""The configuration: a YAML file read, checked and turned into immutable dataclasses.

`loader.load_config` returns a `settings.types.Config` or raises its `ConfigError` with every
problem found, each as `<path>: <reason>`. The dataclasses live in `settings/`, below this room
and every other, so cloud and template stand on them without reaching up here. Inside:
`yamlfile` (strict YAML reading), `reader` (typed field access collecting issues), `values`
(pure value checks), one module per section (`groups`, `interfaces`, `kubelet`, `kubernetes`,
`pricing`), `loader` (the top level, TLS files, the API token), `advice` (warnings about a
valid config) and `schema` (the chart's JSON Schema, from the same definitions). Nothing here
talks to a network or to Kubernetes, and nothing here imports the engine: the checks that do
belong to the commands that run them.

This file imports nothing.
"""
