"""``python -m server.sim``: see ``server.sim.cli``."""

import sys

from server.sim.cli import main

sys.exit(main())
