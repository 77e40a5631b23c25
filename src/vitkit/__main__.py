"""``python -m vitkit ...`` is the ``vitkit`` command."""

import sys

from vitkit.cli import main

sys.exit(main())
