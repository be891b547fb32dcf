"""What the configuration says, as plain immutable values: `types` holds the dataclasses
(`Config`, `NodeGroupConfig`, ...), `ConfigError` and the defaults.

They stand below every room that reads a setting (cloud, template, config itself, the engine
and up), so each imports them downward. This file imports nothing.
"""
