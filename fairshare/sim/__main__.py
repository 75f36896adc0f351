"""``python -m fairshare.sim``: see ``fairshare.sim.command``."""

import sys

from fairshare.sim.command import main

sys.exit(main())
