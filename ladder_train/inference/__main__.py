"""``python -m ladder_train.inference`` is ``ladder-generate``; tensor parallel:
``torchrun --nproc-per-node N -m ladder_train.inference MODEL --prompt ...``."""

import sys

from ..cli import ladder_generate

if __name__ == "__main__":
    sys.exit(ladder_generate())
