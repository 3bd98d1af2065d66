"""Backward through a recurrent encoder in eval mode on a CUDA device.

cuDNN's RNN backward refuses to run in eval mode ("cudnn RNN backward can only be called in
training mode"), and the gradient-based importances (:func:`attnmetrics.gradient_importance`,
:func:`attnmetrics.integrated_gradients`, :func:`attnmetrics.input_x_gradient`) differentiate the
model in eval mode. :func:`eval_mode_backward` switches cuDNN off for just their forward and
backward passes, so PyTorch's native RNN kernels run them: the same eval-mode function (no
dropout, the same weights), differentiable, slower than cuDNN only in those passes. The
alternative, the RNN modules in training mode with their dropout set to 0, would change what
other modules and user hooks see (``training`` is True) and is not taken.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

#: device types on which cuDNN serves the RNN modules (a test may widen it to stub a backend)
CUDNN_DEVICE_TYPES = ("cuda",)


def has_recurrent_module(model: object) -> bool:
    """True when ``model`` is an ``nn.Module`` holding an ``nn.RNNBase`` (LSTM, GRU, RNN)."""
    return isinstance(model, nn.Module) and any(isinstance(m, nn.RNNBase) for m in model.modules())


def eval_mode_backward(model: object, device: torch.device) -> contextlib.AbstractContextManager:
    """A context in which ``model``'s forward and backward passes on ``device`` may differentiate
    its recurrent modules in eval mode: cuDNN is off inside it when ``model`` has an RNN module and
    ``device`` is a CUDA device; otherwise it changes nothing. cuDNN's setting is restored on exit
    (``torch.backends.cudnn.flags``)."""
    if torch.device(device).type in CUDNN_DEVICE_TYPES and has_recurrent_module(model):
        return torch.backends.cudnn.flags(enabled=False)
    return contextlib.nullcontext()
