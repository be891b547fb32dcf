"""Live configuration reload: `serve` takes a changed config file without a restart.

- fixed.py: what a reload may not change (the process's own settings), each refused by name;
- reloader.py: noticing a change (the file's content, whatever swapped it in, or SIGHUP),
  validating it as `check-config --online` does, and applying it between calls, whole or not
  at all; what the last attempt did, for /status, the metrics and the Events.
"""
