"""Link calendars: utilisation committed by earlier trains, spare capacity for later ones."""
from kbtorch.sim.calendar import avail, forget, occupy, serialise


def test_full_use_then_idle():
    ts, us = [0, 1000], [1.0]
    assert avail(ts, us, 0, 500, 500) == (1500, 1500)
    assert avail(ts, us, 200, 100, 500) == (1100, 1500)


def test_half_use_leaves_half_the_capacity():
    ts, us = [0, 1000], [0.5]
    assert avail(ts, us, 0, 500, 700) == (1000, 1200)
    assert avail(ts, us, 0, 100, 500) == (200, 1000)


def test_both_times_match_one_pass_each():
    ts, us = [0, 300, 700, 1000, 1600], [0.25, 1.0, 0.5, 0.75]
    for h in (0, 150, 650, 900):
        for first, work in ((10, 10), (50, 400), (200, 900), (600, 2000)):
            a, b = avail(ts, us, h, first, work)
            assert a == avail(ts, us, h, first, first)[0] and b == avail(ts, us, h, work, work)[1]
            assert a <= b


def test_occupy_fills_spare_capacity_and_merges():
    ts, us = [0, 1000], [0.5]
    occupy(ts, us, 0, 1000, 500)
    assert (ts, us) == ([0, 1000], [1.0])
    occupy(ts, us, 500, 2000, 1000)
    assert ts == [0, 2000] and us == [1.0]


def test_occupy_beyond_the_end_and_forget():
    ts, us = [0, 1000], [1.0]
    occupy(ts, us, 500, 3000, 1000)
    assert ts[-1] == 3000 and abs(sum((1 - u) * (b - a) for a, b, u in zip(ts, ts[1:], us)) - 1000) < 1e-9
    forget(ts, us, 1500)
    assert ts[0] == 1000


def test_serialise_a_second_full_rate_train_behind_the_first():
    ts, us = [], []
    assert serialise(ts, us, 0, 0, 4, 100, now=0) == (100, 400)        # idle link: the train as it came
    head, tail = serialise(ts, us, 0, 300, 4, 100)                     # same time, same rate: behind it
    assert (head, tail) == (500, 800)


def test_serialise_a_half_rate_train_leaves_room_for_another():
    ts, us = [], []
    serialise(ts, us, 0, 600, 4, 100, now=0)                            # 4 flits over 700 ps: under 60%
    head, tail = serialise(ts, us, 0, 0, 2, 100)                        # fits in the gaps, not after it
    assert tail < 700
