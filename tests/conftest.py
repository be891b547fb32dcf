"""Shared fixtures live in tests/fixtures/, one module per area, loaded as plugins."""

pytest_plugins = [
    "fixtures.hypothesis_profiles",
    "fixtures.tls",
    "fixtures.emulator",
    "fixtures.stack",
    "fixtures.kube",
]
