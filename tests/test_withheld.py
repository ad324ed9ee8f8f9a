"""withheld(): a library reference is out of reach while the learner's function is checked."""

import math
import sys

import pytest

from distlab import sim
from distlab.withheld import ExerciseShortcut, expect, expect_close, withheld


def learners_shortcut(n_bytes, seconds):
    return sim.busbw("all_reduce", 8, n_bytes, seconds)  # calls the reference: not allowed


def learners_own(n_bytes, seconds):
    return n_bytes / seconds * 2 * 7 / 8


def test_the_reference_raises_inside_and_comes_back_after():
    want = sim.busbw("all_reduce", 8, 10**9, 0.01)
    with withheld(sim.busbw, exercise="bandwidths") as calls:
        assert math.isclose(learners_own(10**9, 0.01), want)
        with pytest.raises(ExerciseShortcut, match="asks you to write this yourself"):
            learners_shortcut(10**9, 0.01)
    assert calls == ["distlab.sim.busbw"] or calls[0].endswith(".busbw")
    assert sim.busbw("all_reduce", 8, 10**9, 0.01) == want  # put back


def test_names_bound_in_the_notebook_and_imported_modules_are_hidden_too():
    from distlab.sim import cost

    main = sys.modules["__main__"]
    main.my_alias = sim.busbw  # `from distlab.sim import busbw as my_alias` in a notebook
    try:
        with withheld(sim.busbw, exercise="x"):
            with pytest.raises(ExerciseShortcut):
                main.my_alias("all_reduce", 2, 1, 1)
            if hasattr(cost, "busbw"):
                with pytest.raises(ExerciseShortcut):
                    cost.busbw("all_reduce", 2, 1, 1)
        assert main.my_alias is sim.busbw
    finally:
        del main.my_alias


def test_a_method_on_a_class_is_hidden():
    class Plan:  # stands in for a library class; registered in a scanned module below
        def estimate_for(self):
            return 42

    import distlab

    distlab._test_plan_class = Plan
    try:
        with withheld(Plan.estimate_for, exercise="capstone"), pytest.raises(ExerciseShortcut):
            Plan().estimate_for()
        assert Plan().estimate_for() == 42
    finally:
        del distlab._test_plan_class


def test_everything_is_put_back_when_the_check_fails():
    with pytest.raises(AssertionError), withheld(sim.busbw, exercise="x"):
        raise AssertionError("the learner's value was wrong")
    assert sim.busbw("all_reduce", 2, 2, 1) == 2.0  # the real one again


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="at least one"), withheld(exercise="x"):
        pass
    with pytest.raises(TypeError, match="hides functions, got int"), withheld(3, exercise="x"):
        pass


def test_expect_messages_say_what_both_values_and_the_hint():
    with pytest.raises(AssertionError) as info:
        expect_close(
            "busbw of 1 GB in 10 ms on 8 ranks",
            1e11,
            1.75e11,
            hint="multiply algbw by 2(n-1)/n for an all-reduce",
        )
    message = str(info.value)
    assert (
        "busbw of 1 GB" in message and "100000000000.0" in message and "175000000000.0" in message
    )
    assert "2(n-1)/n" in message and "ratio yours/expected = 0.5714" in message
    expect(True, "x", 1, 1)
    expect_close("x", 1.0, 1.0)
    with pytest.raises(AssertionError, match="yours is 'a', expected 1"):
        expect_close("x", "a", 1)


# --- shortcuts that rebinding names cannot see: the code that runs is what counts ---------

_SAVED = sim.busbw  # a reference taken at cell level, before the test cell runs


def by_default_argument(n_bytes, seconds, _ref=sim.busbw):
    return _ref("all_reduce", 8, n_bytes, seconds)


def by_partial(n_bytes, seconds):
    import functools

    return functools.partial(_SAVED, "all_reduce", 8)(n_bytes, seconds)


_TABLE = {"busbw": sim.busbw}


def by_dict(n_bytes, seconds):
    return _TABLE["busbw"]("all_reduce", 8, n_bytes, seconds)


def _copied():
    import inspect

    namespace = dict(vars(sys.modules[sim.busbw.__module__]))
    exec(inspect.getsource(sim.busbw), namespace)  # noqa: S102 - the shortcut under test
    return namespace["busbw"]


_COPY = _copied()


def by_copy(n_bytes, seconds):
    return _COPY("all_reduce", 8, n_bytes, seconds)


def in_a_thread(n_bytes, seconds):
    import threading

    out = []
    worker = threading.Thread(target=lambda: out.append(_SAVED("all_reduce", 8, n_bytes, seconds)))
    worker.start()
    worker.join()
    return out[0]


@pytest.mark.parametrize(
    "shortcut", [by_default_argument, by_partial, by_dict, by_copy, in_a_thread]
)
def test_a_reference_taken_before_the_block_is_caught_by_what_runs(shortcut):
    want = sim.busbw("all_reduce", 8, 10**9, 0.01)
    with (
        pytest.raises(ExerciseShortcut, match=r"your code ran \S*busbw.*default argument"),
        withheld(sim.busbw, exercise="bandwidths") as calls,
    ):
        got = shortcut(10**9, 0.01)  # the right value, by the library
        expect_close("busbw", got, want)
    assert calls and calls[0].endswith("busbw")
    assert sys.gettrace() is None, "the watch is removed"


def test_a_failing_check_that_also_ran_the_reference_says_so():
    with (
        pytest.raises(ExerciseShortcut, match="your code ran") as info,
        withheld(sim.busbw, exercise="bandwidths"),
    ):
        by_default_argument(10**9, 0.01)
        raise AssertionError("then the learner's value was wrong")
    assert isinstance(info.value.__cause__, AssertionError)


def test_a_withheld_class_covers_every_method_and_a_subclass_calling_saved_originals():
    from distlab.parallel.precision.mixed_precision import DynamicLossScaler

    saved_update = DynamicLossScaler.update

    class Mine(DynamicLossScaler):
        def update(self, found_inf, _original=saved_update):
            return _original(self, found_inf)

    with (
        pytest.raises(ExerciseShortcut, match="DynamicLossScaler.update"),
        withheld(DynamicLossScaler.update, exercise="loss-scaler"),
    ):
        Mine().update(False)


def test_honest_code_and_a_formula_like_the_librarys_pass():
    source = "def double(x):\n    return 2 * x\n"  # the same name and bytes, no docstring
    library, learners = {}, {}
    exec(source, library)  # noqa: S102 - two compilations of one short formula
    exec(source, learners)  # noqa: S102
    with withheld(sim.busbw, library["double"], exercise="x") as calls:
        assert learners_own(10**9, 0.01) > 0
        assert learners["double"](3) == 6
    assert calls == []


def test_the_watch_passes_events_on_to_a_debugger_and_restores_it():
    seen = []

    def debugger(frame, event, arg):
        seen.append(frame.f_code.co_name)

    sys.settrace(debugger)
    try:
        with withheld(sim.busbw, exercise="x"):
            learners_own(1, 1)
        assert sys.gettrace() is debugger
    finally:
        sys.settrace(None)
    assert "learners_own" in seen
