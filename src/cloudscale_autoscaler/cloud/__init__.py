"""The cloud layer: one small protocol (protocol.py), its cloudscale.ch implementation
(client.py) and an emulator of the same REST API (emulator/)."""
