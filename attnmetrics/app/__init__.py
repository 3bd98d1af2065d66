"""The application: the ``attnmetrics`` command line, the faithfulness battery on a trained
model, run folders, reports, figures, sweeps and their aggregation.

The top layer: it builds on the library (:mod:`attnmetrics`) and the models
(:mod:`attnmetrics.models`); neither imports it.
"""
