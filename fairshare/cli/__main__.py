"""``python -m fairshare.cli``: the ``fairshare`` command, without the console script."""

import sys

from fairshare.cli.main import main

sys.exit(main())
