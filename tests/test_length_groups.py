"""``attributions.length_groups``: how the attention-derived methods batch rows by length (issue 46,
item 6: a batch is never much costlier than its rows one by one). Checked against the definition
in its docstring, on many-shaped inputs (hypothesis)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from attnmetrics.attributions import length_groups
from attnmetrics.loo import CPU_PADDING, CPU_SMALL_CALL

lengths_st = st.lists(st.integers(1, 80), min_size=0, max_size=40)


def _bytes(w):
    return 1000 * w * w


@settings(max_examples=300, deadline=None)
@given(lengths=lengths_st, budget=st.integers(1, 10**7), padded=st.booleans())
def test_groups_partition_the_rows_shortest_first_within_the_budget_and_the_padding(lengths, budget, padded):
    groups = length_groups(lengths, _bytes, budget, padded)
    flat = [b for g in groups for b in g]
    assert sorted(flat) == list(range(len(lengths)))  # every row once
    widths = [lengths[b] for b in flat]
    assert widths == sorted(widths)  # consecutive in length order
    for g in groups:
        w = lengths[g[-1]]  # run at its longest row's width
        assert all(lengths[b] <= w for b in g)
        if len(g) > 1:
            assert len(g) * _bytes(w) <= budget
            if not padded:
                cost, own = len(g) * w * w, sum(lengths[b] ** 2 for b in g)
                assert cost <= (1 + CPU_PADDING) * own or (len(g) * w <= CPU_SMALL_CALL and cost <= 2 * own)


@given(lengths=lengths_st)
def test_rows_of_one_length_share_a_call_and_a_padded_device_takes_any_widths(lengths):
    """Within the budget, the rows of one length are in one group on the CPU under the padding rule
    alone (an equal row adds no padding); on a GPU one group holds every row."""
    cpu = length_groups(lengths, _bytes, 10**12, padded=False, small=0)
    group_of = {}
    for index, g in enumerate(cpu):
        for b in g:
            group_of.setdefault(lengths[b], set()).add(index)
    assert all(len(found) == 1 for found in group_of.values())
    gpu = length_groups(lengths, _bytes, 10**12, padded=True)
    assert len(gpu) == (1 if lengths else 0)


def test_a_wider_row_joins_only_while_the_padding_stays_small():
    # 30 and 31: 2 * 31^2 = 1922 <= 1.125 * (900 + 961); 10 and 31: 2 * 961 > 1.125 * 1061
    assert length_groups([31, 30], _bytes, 10**9, padded=False, small=0) == [[1, 0]]
    assert length_groups([31, 10], _bytes, 10**9, padded=False, small=0) == [[1], [0]]
    # a small call (62 padded positions) takes it while within twice its rows' own cost:
    # 5, 5, 31 would cost 3 * 961 > 2 * (25 + 25 + 961)
    assert length_groups([31, 10], _bytes, 10**9, padded=False) == [[1, 0]]
    assert length_groups([31, 5, 5], _bytes, 10**9, padded=False) == [[1, 2], [0]]
    assert length_groups([300, 290], _bytes, 10**9, padded=False) == [[1, 0]]  # 600 > 512 positions: 12.5 %
    # the budget splits even rows of one length; a row over the budget alone is its own group
    assert length_groups([5, 5, 5], _bytes, 2 * _bytes(5), padded=True) == [[0, 1], [2]]
    assert length_groups([50], _bytes, 1, padded=False) == [[0]]
