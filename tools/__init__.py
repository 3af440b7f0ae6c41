"""The repository's own tools, run from its root and not installed with the package (pyproject.toml's package
discovery takes ``ladder_train*`` alone): ``docs_tables`` makes the docs' tables from the data under
``docs/results/``."""
