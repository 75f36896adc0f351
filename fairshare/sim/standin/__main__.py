"""``python -m fairshare.sim.standin``: see ``fairshare.sim.standin.command``."""

import sys

from fairshare.sim.standin.command import main

sys.exit(main())
