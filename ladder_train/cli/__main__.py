"""``python -m ladder_train.cli`` is ``ladder-train`` (slurm/study.sh asks it for a study point's overrides)."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
