"""``python -m api.cli``: the same as the ``sglang-supervisor`` console script."""

import sys

from api.cli.main import main

sys.exit(main())
