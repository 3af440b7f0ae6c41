"""Studies: a grid of training runs over config keys (``ladder-train study``), and the statistics that compare
its layouts (each at its own best learning rate, paired seeds, 95 % intervals)."""
