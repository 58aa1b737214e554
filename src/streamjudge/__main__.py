"""``python -m streamjudge``: the ``streamjudge`` command."""

import sys

from streamjudge.cli import main

sys.exit(main())
