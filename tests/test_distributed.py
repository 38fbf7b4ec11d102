"""The processes' meeting protocol of sharded calls (hcrfast.distributed.World), with two ranks as
two threads on one torch HashStore: every ordering below is forced, none is left to timing."""
import collections
import threading

import pytest

from hcrfast import distributed
from hcrfast.distributed import ShardError, World

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)


@pytest.fixture(autouse=True)
def fresh_calls(monkeypatch):
    monkeypatch.setattr(distributed, "_next_call", collections.defaultdict(int))


def world(rank, store, size=2):
    w = World("cpu")  # alone (no torchrun here), then made rank `rank` of `size` on `store`
    w.rank, w.size = rank, size
    w._store = lambda: store
    return w


def both(first, second, timeout=20):
    """Run ``first()`` and ``second()`` in two threads; their results (or exceptions), in order."""
    out = [None, None]

    def call(i, fn):
        try:
            out[i] = fn()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out[i] = exc

    threads = [threading.Thread(target=call, args=(i, fn)) for i, fn in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    return out


class PausedStore:
    """``inner`` as one rank sees it: ``on(keys, found)`` runs after each of its ``check`` calls."""

    def __init__(self, inner, on):
        self.inner, self.on = inner, on

    def check(self, keys):
        found = self.inner.check(keys)
        self.on(keys, found)
        return found

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_rank_that_passed_the_step_and_left_is_not_taken_for_one_that_never_came():
    """The ordering that a slow rank 0 can meet: it finds rank 1's key of the step absent; rank 1
    then posts it, passes the step and leaves the call; only then does rank 0 look whether rank 1
    left. Rank 0 must pass the step, not report rank 1 gone (it looks at `left` first now, and a
    rank writes `left` after its keys, so it never makes that first lookup: rank 1 goes on after
    a short wait)."""
    store = dist.HashStore()
    looked, left = threading.Event(), threading.Event()

    def on(keys, found):
        if len(keys) == 1 and keys[0].endswith("/1") and "/step" in keys[0] and not found:
            looked.set()  # rank 0 found rank 1's key absent: now let rank 1 pass and leave
            assert left.wait(10)

    class Rank1Store:
        def set(self, key, value):
            if "/step" in key:
                looked.wait(1.0)  # only after rank 0's lookup, where rank 0 makes one
            store.set(key, value)

        def __getattr__(self, name):
            return getattr(store, name)

    def rank0():
        w = world(0, PausedStore(store, on))
        with w.session("test"):
            return w.agree("done", "r0")

    def rank1():
        w = world(1, Rank1Store())
        with w.session("test"):
            got = w.agree("done", "r1")
        left.set()
        return got

    assert both(rank0, rank1) == [["r0", "r1"], ["r0", "r1"]]


def test_a_rank_still_waiting_is_told_that_another_left_without_reaching_its_step():
    store = dist.HashStore()

    def rank0():
        w = world(0, store)
        with w.session("test"):
            w.agree("join")
            return w.agree("extra")  # rank 1's path has no such step

    def rank1():
        w = world(1, store)
        with w.session("test"):
            return w.agree("join")

    got = both(rank0, rank1)
    assert got[1] == [None, None]
    assert isinstance(got[0], ShardError) and "rank 1 finished the call without reaching the step 'extra'" in str(got[0])


def test_ranks_at_different_steps_both_raise_naming_each_ones_step():
    store = dist.HashStore()

    def at(rank, step):
        def run():
            w = world(rank, store)
            with w.session("test"):
                return w.agree(step)
        return run

    got = both(at(0, "weights"), at(1, "key"))
    for exc in got:
        assert isinstance(exc, ShardError), exc
        assert "the processes reached different steps (rank 0 at 'weights', rank 1 at 'key')" in str(exc)


def test_a_rank_given_up_on_skips_that_call_and_the_next_calls_meet():
    """Rank 1 never makes call 0; rank 0 gives up on it there. Rank 1's next call (made after that)
    skips call 0 and meets rank 0's next call; the call after meets too."""
    store = dist.HashStore()
    given_up = threading.Event()

    def rank0():
        w = world(0, store)
        try:
            with w.session("test"):
                w.agree("join", timeout=0.3)
        except ShardError as exc:
            assert "rank 1 of 2 did not come within 0.3 s" in str(exc)
        given_up.set()
        out = []
        for _ in range(2):
            with w.session("test"):
                out.append(w.agree("join", 0, timeout=10))
        return out

    def rank1():
        assert given_up.wait(10)
        w = world(1, store)
        out = []
        for _ in range(2):
            with w.session("test"):
                out.append(w.agree("join", 1, timeout=10))
        return out

    assert both(rank0, rank1) == [[[0, 1], [0, 1]]] * 2


def test_an_error_inside_a_session_reaches_the_other_rank_and_cleanups_run_however_it_ends():
    store = dist.HashStore()
    tidied = []

    def rank0():
        w = world(0, store)
        with w.session("test"):
            w.at_end(tidied.append, 0)
            raise ValueError("bad sigma on rank 0")

    def rank1():
        w = world(1, store)
        with w.session("test"):
            w.at_end(tidied.append, 1)
            return w.agree("join")

    got = both(rank0, rank1)
    assert isinstance(got[0], ValueError)
    assert isinstance(got[1], ShardError) and "rank 0: ValueError: bad sigma on rank 0" in str(got[1])
    assert sorted(tidied) == [0, 1]
    alone = World("cpu")  # one process: the session still runs its cleanups
    with alone.session("test"):
        alone.at_end(tidied.append, "alone")
    assert tidied[-1] == "alone"


def test_differences_names_every_key_that_differs_or_is_missing_on_either_side():
    mine = {"a": 1, "b": [1, 2], "c": "x", "only_mine": 0}
    theirs = {"a": 1, "b": [1, 3], "c": "x", "only_theirs": None, "also_theirs": 5}
    assert distributed.differences(mine, theirs) == ["also_theirs", "b", "only_mine"]
    assert distributed.differences(theirs, mine) == ["also_theirs", "b", "only_mine"]
    assert distributed.differences(mine, dict(mine)) == []


def test_ranks_that_make_different_calls_are_told_each_ones_value_not_none():
    """A key leaves out an argument at its default (iterates="last", singular_steps=0, keep_targeted_eps=False:
    older checkpoints never recorded them); a sharded call whose ranks differed there named the default None
    ("iterates ('all' on rank 0, None on rank 1)"). Both ranks now name what the absence means, as a checkpoint's
    mismatch does."""
    import torch

    from hcrfast import algorithm

    store = dist.HashStore()
    keys = [dict(noise="n", iterates="all", singular_steps=6), dict(noise="n", keep_targeted_eps=True)]

    def at(rank):
        def run():
            w = world(rank, store)
            with w.session("hcrfast.bound(shard=True)"):
                return algorithm._join(w, None, keys[rank], None, None, 4, torch.device("cpu"))
        return run

    got = both(at(0), at(1))
    for exc in got:
        assert isinstance(exc, ShardError), exc
        assert ("rank 1 differs in iterates ('all' on rank 0, 'last' on rank 1), keep_targeted_eps (False on rank 0, "
                "True on rank 1), singular_steps (6 on rank 0, 0 on rank 1)") in str(exc), str(exc)
