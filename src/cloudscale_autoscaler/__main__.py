import sys

from cloudscale_autoscaler.cli import main

sys.exit(main())
