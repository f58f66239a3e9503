"""`python -m kmp_cli ...`: the `kmp` command."""

import sys

from kmp_cli import main

sys.exit(main())
