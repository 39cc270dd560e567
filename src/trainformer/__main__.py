"""`python -m trainformer` = the `trainformer` command."""

import sys

from trainformer.cli import main

sys.exit(main())
