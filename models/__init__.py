"""The concrete models: J&W's attention classifiers, leave-one-out state reuse, training loops,
and the paper experiments that train models (W&P, T&Š).

Imported as ``attnmetrics.models`` (this folder is linked into the package as
``attnmetrics/models``). It builds on the library core and the data (:mod:`attnmetrics.data`), never the reverse, and never imports
the application (:mod:`attnmetrics.app`).
"""
