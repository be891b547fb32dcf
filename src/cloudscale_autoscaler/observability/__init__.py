"""What an operator sees of a running provider: its log (`logs`: plain or JSON lines, request
ids, secrets masked; `echo`: client-supplied values bounded in messages), its metrics
(`metrics`), the status snapshot (`status`) and the HTTP endpoint serving them with the health
checks (`endpoint`)."""
