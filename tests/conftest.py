"""Shared fixtures live in tests/fixtures/, one module per area, loaded as plugins."""

pytest_plugins = ["fixtures.tls", "fixtures.emulator", "fixtures.stack"]
