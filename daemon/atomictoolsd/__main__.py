"""``python -m atomictoolsd``: the same as the ``atomictoolsd`` command."""

import sys

from atomictoolsd.cli import main

sys.exit(main())
