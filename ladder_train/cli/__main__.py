"""``python -m ladder_train.cli`` is ``ladder-train`` (slurm/study.sh asks it for a study point's overrides)."""

import sys

from . import main

sys.exit(main())
