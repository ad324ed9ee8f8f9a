"""``python -m distlab.site build``: the same as ``distlab site build``."""

import sys

from distlab.site.command import main

sys.exit(main())
