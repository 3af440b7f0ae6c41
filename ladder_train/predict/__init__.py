"""The analytic predictor behind ``ladder-predict``: it never runs the model. ``shapes`` (model sizes),
``hardware`` (profiles, ``hardware.yaml``), ``perfmodel`` (roofline costs and the simulated timeline), ``grid``
(predictions over models, profiles, links and TP degrees), ``compare`` (against ladder-bench rows), ``calibrate``
(measure this machine's ``cpu`` profile) and ``validation`` (calibrate, bench and compare in one run).
``python -m ladder_train.predict`` is ``ladder-predict``."""
