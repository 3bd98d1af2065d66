"""Concrete attention classifiers, datasets, training loops and the command line.

Installed as ``attnmetrics_models``; it builds on ``attnmetrics``, never the reverse.
"""
