"""distlab.progress: the one progress bar (distlab bench, distlab grade, benchmarks/)."""

from distlab.progress import progress_bar


def test_the_bar_stays_off_when_stderr_is_not_a_terminal(capsys):
    with progress_bar("work", total=2) as bar:
        bar.step("first")
        bar.advance()
        bar.advance()
    assert not bar.shown
    assert capsys.readouterr() == ("", "")


def test_the_bar_draws_on_a_terminal_and_only_when_enabled(capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich then treats stderr as a terminal
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    with progress_bar("work", total=2) as bar:
        bar.step("grading 02-collectives")
        bar.advance(2)
    assert bar.shown
    assert "grading 02-collectives" in capsys.readouterr().err
    with progress_bar("work", total=1, enabled=False) as off:
        off.advance()
    assert not off.shown
    assert capsys.readouterr().err == ""
