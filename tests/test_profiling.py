"""NVTX ranges: the nvtx package's domain when installed, torch.cuda.nvtx's prefixed names without it."""
import contextlib

import pytest

from hcrfast import profiling


@pytest.fixture
def fresh(monkeypatch):
    cached = (profiling._nvtx, profiling._torch_nvtx, profiling._range, profiling._tracked)
    for f in cached:
        f.cache_clear()
    yield monkeypatch
    for f in cached:
        f.cache_clear()


def test_nvtx_package_ranges_are_in_the_hcrfast_domain(fresh):
    nvtx = pytest.importorskip("nvtx")
    rng = profiling.annotate("lsqr-iterations")   # (recorded as open in this thread too: open_ranges)
    assert isinstance(rng.inner, nvtx.annotate) and rng.inner.init_args[:3] == ("lsqr-iterations", None, "hcrfast")
    with rng:
        pass


def test_without_the_nvtx_package_torch_emits_prefixed_ranges(fresh):
    pushed = []

    class FakeTorchNvtx:
        @staticmethod
        @contextlib.contextmanager
        def range(msg):
            pushed.append(msg)
            yield

    fresh.setattr(profiling, "_nvtx", lambda: None)
    fresh.setattr(profiling, "_torch_nvtx", lambda: FakeTorchNvtx)
    with profiling.annotate("jvp"):
        pass
    assert pushed == ["hcrfast:jvp"]


def test_with_neither_the_range_is_a_null_context(fresh):
    fresh.setattr(profiling, "_nvtx", lambda: None)
    fresh.setattr(profiling, "_torch_nvtx", lambda: None)
    assert isinstance(profiling.annotate("jvp").inner, contextlib.nullcontext)


def test_a_range_is_open_in_its_thread_while_it_runs_and_not_after_an_error(fresh):
    """progress=True's heartbeat names the ranges open in the chunk's thread (profiling.open_ranges)."""
    import threading

    me = threading.get_ident()
    with profiling.annotate("bound"):
        with profiling.annotate("dense-solve"):
            assert profiling.open_ranges(me) == ("bound", "dense-solve")
            seen = []
            other = threading.Thread(target=lambda: seen.append(profiling.open_ranges(threading.get_ident())))
            other.start()
            other.join()
            assert seen == [()]
        with pytest.raises(RuntimeError):
            with profiling.annotate("certify"):
                raise RuntimeError("the model's")
        assert profiling.open_ranges(me) == ("bound",)
    assert profiling.open_ranges(me) == ()


def test_a_range_whose_push_is_interrupted_is_not_left_open():
    """A Ctrl-C inside the range's push (NVTX's __enter__): the block never ran, so its exit never came, and the
    name stayed in the thread's open ranges, named by every later heartbeat line."""
    import threading

    class Interrupted:
        def __enter__(self):
            raise KeyboardInterrupt

        def __exit__(self, *exc):
            raise AssertionError("never entered, never exited")

    me = threading.get_ident()
    with pytest.raises(KeyboardInterrupt):
        with profiling._Tracked("jvp", Interrupted()):
            pass
    assert profiling.open_ranges(me) == ()


def test_a_ctrl_c_while_the_heartbeat_starts_stops_its_thread(monkeypatch):
    """progress=True's heartbeat thread started before the block that stops it: a Ctrl-C that landed in
    Thread.start (after the thread ran) left it beating, a line every 30 s, for the rest of the process."""
    import threading
    import time

    from hcrfast import algorithm

    start = threading.Thread.start

    def start_then_interrupted(self):
        start(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", start_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        with algorithm._heartbeat(True, 0, 4, 4, time.perf_counter()):
            raise AssertionError("the block does not run")
    monkeypatch.undo()
    assert not [t for t in threading.enumerate() if t.name == "hcrfast-heartbeat"]
