"""``python -m ladder_train.predict`` is ``ladder-predict`` (``predict/validation.py`` runs its ``--compare``)."""

import sys

from ..cli import ladder_predict

if __name__ == "__main__":
    sys.exit(ladder_predict())
