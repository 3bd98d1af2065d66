"""The application: the ``attnmetrics`` command line, the faithfulness battery on a trained
model, W&P's experiments that train models, run folders, reports, figures, sweeps and their
aggregation.

The top layer: it builds on the library (:mod:`attnmetrics`), the data (:mod:`attnmetrics.data`)
and the models (:mod:`attnmetrics.models`); none of them imports it.
"""
