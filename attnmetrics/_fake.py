"""Fake (meta) impls of the ops: output shapes and dtypes only, so ``torch.compile`` and
``torch.library.opcheck`` can trace through them without running a kernel.

Imported by :mod:`attnmetrics._ops` once the extension has registered the schemas.
"""

import torch


@torch.library.register_fake("attnmetrics::tvd")
def _tvd_fake(p, q):
    return p.new_empty(p.shape[:-1])


@torch.library.register_fake("attnmetrics::jsd")
def _jsd_fake(p, q):
    return p.new_empty(p.shape[:-1])


@torch.library.register_fake("attnmetrics::value_flags")
def _value_flags_fake(p, q):
    return p.new_empty((1,), dtype=torch.int32)


@torch.library.register_fake("attnmetrics::tvd_checked")
def _tvd_checked_fake(p, q, flags):
    return p.new_empty(p.shape[:-1])


@torch.library.register_fake("attnmetrics::jsd_checked")
def _jsd_checked_fake(p, q, flags):
    return p.new_empty(p.shape[:-1])


@torch.library.register_fake("attnmetrics::kendall_tau")
def _kendall_tau_fake(x, y, lengths):
    return x.new_empty(x.shape[:1]), x.new_empty(x.shape[:1])


@torch.library.register_fake("attnmetrics::flip_search_linear")
def _flip_search_linear_fake(attention, projected, bias, order, lengths):
    b = attention.shape[:1]
    return attention.new_empty(b, dtype=torch.int64), attention.new_empty(b)


@torch.library.register_fake("attnmetrics::renormalised_contexts")
def _renormalised_contexts_fake(attention, values, order, lengths, offsets):
    n = torch.library.get_ctx().new_dynamic_size()
    return values.new_empty(n, values.shape[-1])


@torch.library.register_fake("attnmetrics::attention_permutations")
def _attention_permutations_fake(lengths, width, permutations, seed, row_offset=0, permutation_offset=0):
    return lengths.new_empty((lengths.shape[0], permutations, width), dtype=torch.int64)


@torch.library.register_fake("attnmetrics::permutation_tvd_linear")
def _permutation_tvd_linear_fake(attention, projected, bias, lengths, permutations, seed, row_offset=0):
    b = attention.shape[0]
    return attention.new_empty(b), attention.new_empty(b, permutations)


@torch.library.register_fake("attnmetrics::project_prefix")
def _project_prefix_fake(values, weight, lengths):
    return values.new_empty(values.shape[0], values.shape[1], weight.shape[0])


@torch.library.register_fake("attnmetrics::leave_one_out_batch")
def _leave_one_out_batch_fake(tokens, lengths, lead, trail, mask_token=None, pad=0):
    ctx = torch.library.get_ctx()
    n, width = ctx.new_dynamic_size(), ctx.new_dynamic_size()
    return tokens.new_empty(n, width), tokens.new_empty(n), tokens.new_empty(n)  # lengths may be on the host


@torch.library.register_fake("attnmetrics::rationale_batch")
def _rationale_batch_fake(tokens, lengths, rank, sizes, lead, trail, keep_rationale, mask_token=None, pad=0):
    n = torch.library.get_ctx().new_dynamic_size()
    return tokens.new_empty(n, tokens.shape[1]), tokens.new_empty(n), tokens.new_empty(n), tokens.new_empty(n)


@torch.library.register_fake("attnmetrics::attention_rollout")
def _attention_rollout_fake(attentions, lengths, residual):
    b, t = attentions.shape[0], attentions.shape[3]
    return attentions.new_empty(b, t, t)


@torch.library.register_fake("attnmetrics::lstm_runs")
def _lstm_runs_fake(gates, index, counts, h0, c0, weight, out, states=None):
    return None  # writes into out (and states)


@torch.library.register_fake("attnmetrics::spliced_attention")
def _spliced_attention_fake(table, pairs, lengths, v, lead, trail, tanh):
    return table.new_empty(pairs.shape[0], table.shape[1] - v.shape[0])


@torch.library.register_fake("attnmetrics::attention_flow")
def _attention_flow_fake(graphs, lengths, pooled, lead, trail):
    return graphs.new_empty(graphs.shape[0], graphs.shape[2])
