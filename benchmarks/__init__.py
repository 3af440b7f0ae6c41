"""Developer benchmarks of ladder-train's own machinery (not installed with the package; run from the
repository root, e.g. ``python -m benchmarks.train_step``). Their figures are in docs/benchmarks.md. The
product's benchmark of TP generation is the ``ladder-bench`` command."""
