"""``python -m ladder_train.serve`` is the vLLM decode TPOT benchmark (ladder_train/cli/serve_bench.py's flags)."""

import sys

from ..cli import vllm_tpot

if __name__ == "__main__":
    sys.exit(vllm_tpot())
