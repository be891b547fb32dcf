"""`cloudscale-autoscaler serve --config FILE`: load the config and run the provider (app.py)
until SIGTERM or SIGINT, reloading FILE when it changes or on SIGHUP (reload/).

Exit codes: 0 = stopped by a signal, 1 = could not start (TLS files, the listen address, the
Kubernetes side), 2 = invalid config.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from cloudscale_autoscaler.app import run
from cloudscale_autoscaler.config.loader import load_config
from cloudscale_autoscaler.observability.logs import to_stderr
from cloudscale_autoscaler.reload.reloader import ConfigFile
from cloudscale_autoscaler.settings.types import ConfigError

log = logging.getLogger(__name__)

EXIT_BAD_CONFIG = 2


def serve_command(config_path: Path) -> int:
    source = ConfigFile.before_loading(config_path)
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        to_stderr(log, logging.ERROR, f"{exc.source}: invalid config", exc.errors)
        return EXIT_BAD_CONFIG
    return asyncio.run(run(config, source=source))
