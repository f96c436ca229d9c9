"""python -m jobs: the same as python -m jobs.recompute."""

import sys

from jobs.recompute import main

sys.exit(main())
