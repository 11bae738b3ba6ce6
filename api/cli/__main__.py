"""``python -m sglang_supervisor_api.cli``: the same as the ``sglang-supervisor`` console script."""

import sys

from sglang_supervisor_api.cli import main

sys.exit(main())
