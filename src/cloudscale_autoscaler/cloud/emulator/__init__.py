"""An emulator of the part of the cloudscale.ch REST API (v1) this project uses, with an admin
API for tests and deterministic fault injection.

docs/emulator.md is the reference: the endpoints, the admin API and fault body, and the list of
behaviours that are ASSUMPTIONS about the real API rather than confirmed facts.

Modules: catalogue (flavors, images, zones, server groups), records (one server and its JSON),
state (the store and its indexes), validation (DRF-shaped field errors), faults (the fault
set), api (/v1 and its fault pipeline), admin (/_emulator), server (the aiohttp application
and Emulator; commands/emulator.py runs it on its own).
"""
