"""What an operator sees of a running provider: its log (`logs`: plain or JSON lines, request
ids, secrets masked; `echo`: client-supplied values bounded in messages), its metrics
(`metrics`) and the HTTP endpoint serving them, the status view and the health checks
(`endpoint`). It imports no other room: every room reports through it, and the status view it
serves is composed at the package root (`status.py`)."""
