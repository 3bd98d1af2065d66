"""attnmetrics: does a model's attention explain its decision?"""
