"""``python -m sim``: see ``sim.command``."""

import sys

from sim.command import main

sys.exit(main())
