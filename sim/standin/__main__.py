"""``python -m sim.standin``: see ``sim.standin.command``."""

import sys

from sim.standin.command import main

sys.exit(main())
