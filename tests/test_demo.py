"""`cloudscale-autoscaler demo --once`: the README's first command, run as users run it."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_once_shows_the_whole_loop() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cloudscale_autoscaler", "demo", "--once"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr
    # Its own config trips no warning (tests/test_shipped_configs.py: check-config --online);
    # the warning about the creation it makes fail is part of the show.
    assert "WARNING cloudscale_autoscaler.app: config:" not in done.stderr, done.stderr
    # Template: allocatable is capacity minus the configured reservations (kubelet arithmetic).
    assert re.search(r"cpu\s+capacity 4\s+allocatable 3900m", out)
    assert re.search(r"memory\s+capacity 8Gi\s+allocatable 7580Mi", out)
    assert "nodeBytes == nodeInfo: True" in out
    # Scale-up from zero: two real instances running.
    assert "target before: 0" in out
    assert len(re.findall(r"cloudscale://[0-9a-f-]{36}  instanceRunning", out)) >= 2
    # The injected failure becomes a placeholder with CA's OutOfResources class, then rolls back.
    assert re.search(
        r"cloudscale://failed-\S+  instanceCreating  error=ZONE_CAPACITY_EXHAUSTED class=1", out
    )
    assert "placeholder gone, target rolled back to 3" in out
    # Scale-down to zero.
    assert "deleted 3 servers; target now 0" in out
    assert "after Refresh: 0 instances left in the cloud" in out
