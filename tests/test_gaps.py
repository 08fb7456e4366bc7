"""The host-gap rule (dpro_kit/readers/gaps.py) on hand-computed sequences."""
from dpro_kit.readers.gaps import fold_gaps


def test_gaps_are_folded_into_the_op_after_them_and_ends_never_move():
    # ops [0,10] [12,20] [15,18] (overlaps: keeps its start) [25,30]; from the step start -5
    starts, ends = [0, 12, 15, 25], [10, 20, 18, 30]
    assert fold_gaps(starts, ends, -5) == [-5, 10, 15, 20]
    assert fold_gaps(starts, ends) == [0, 10, 15, 20]        # None: the first op keeps its start


def test_a_wait_that_ended_in_the_gap_folds_only_the_time_after_it():
    # op 1 waited for something that ended at 14: it starts at 14, not 10; op 2's wait ended before
    # the ops before it did (5 < 20): the usual fold
    starts, ends = [0, 16, 25], [10, 20, 30]
    assert fold_gaps(starts, ends, after=[None, 14, 5]) == [0, 14, 20]
    # no start given and the first op waited: from the end of its wait
    assert fold_gaps([3, 8], [5, 9], after=[1, None]) == [1, 5]


def test_keep_leaves_a_gap_that_was_a_wait():
    starts, ends = [0, 12, 25], [10, 20, 30]
    seen = []

    def keep(i, frm):
        seen.append((i, frm))
        return i == 1
    assert fold_gaps(starts, ends, keep=keep) == [0, 12, 20]
    assert seen == [(1, 10), (2, 20)]   # asked only where a gap would be folded, with where it begins
