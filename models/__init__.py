"""The concrete models: J&W's attention classifiers (with T&Š's regularisers and W&P's uniform
and imposed attention), leave-one-out state reuse, GPT-1 and the Hugging Face adapter, training
and pre-training loops. W&P's experiments that train models are in the application.

Imported as ``attnmetrics.models`` (this folder is linked into the package as
``attnmetrics/models``). It builds on the library core and the data (:mod:`attnmetrics.data`),
never the reverse, and never imports the application (:mod:`attnmetrics.app`).
"""
