"""Helpers for the reliability tests: a background event loop for synchronous Hypothesis
tests (campaign, fuzz), the world they drive (emulator + the real server) and its checks."""
