"""`python -m harness.compare SCENARIO`: the same as `meshbridge compare`."""

import sys

from harness.compare.cli import main

sys.exit(main())
