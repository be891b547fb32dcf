"""The subcommands of `cloudscale-autoscaler`, one module each: thin functions over the library
that load what they need, run it, print the outcome and return the exit code. Nothing outside
this package and `cli.py` imports a command."""
