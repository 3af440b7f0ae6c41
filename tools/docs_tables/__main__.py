"""``python -m tools.docs_tables (--write | --check) [--root DIR]``, from the repository's root."""

import sys

from .docs import main

if __name__ == "__main__":
    sys.exit(main())
