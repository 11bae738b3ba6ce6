"""``python -m api.cli``: the same as the ``sglang-supervisor`` console script."""

import sys

from api.cli import main

sys.exit(main())
