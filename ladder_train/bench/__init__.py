"""The speed benchmark of tensor-parallel generation (``ladder-bench``): ``runner`` measures, ``results`` derives,
prints and reads back its JSON lines, ``link_sweep`` sets an emulated-link sweep beside the predictor's timeline.
``torchrun --nproc-per-node N -m ladder_train.bench ...`` runs it on N ranks."""
