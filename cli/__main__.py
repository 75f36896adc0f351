"""``python -m cli``: the ``fairshare`` command, for a checkout without the console script."""

import sys

from cli.main import main

sys.exit(main())
