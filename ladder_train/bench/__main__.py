"""``python -m ladder_train.bench`` is ``ladder-bench`` (what torchrun launches with ``-m``)."""

import sys

from ..cli import ladder_bench

if __name__ == "__main__":
    sys.exit(ladder_bench())
