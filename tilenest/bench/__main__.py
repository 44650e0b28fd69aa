"""``python -m tilenest.bench``: :func:`tilenest.bench.main`."""

import sys

from . import main

sys.exit(main())
