"""`python -m meshbridge` is `meshbridge`."""

import sys

from meshbridge.cli import main

sys.exit(main())
