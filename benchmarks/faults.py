"""Fault injection: fire the faults a user's machine meets and print what each one led to.

    python benchmarks/faults.py            # every fault (about 3 minutes on 2 cores)
    python benchmarks/faults.py --only grader,launch

Each row is one fault, fired for real, and its outcome:

* ``clean``: the expected error, naming what is wrong, on every rank, and nothing left
  running afterwards;
* ``refused``: a bad value or disagreeing ranks stopped before any work, with the message
  shown;
* ``hang``: it ran into the time bound (the job's timeout, or the bound given here);
* ``left running``: processes or temporary folders outlived the fault (how many);
* ``wrong``: it finished, but with a wrong result or no error where one was due.

The seconds are from firing the fault to the outcome. The fast cases are also tests
(tests/test_processes.py, tests/test_disagreeing_ranks.py, tests/test_grading_ways_out.py,
tests/test_compose_agreement.py, tests/test_bad_input.py); this script fires the slow ones
too and prints the whole table in one run.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat

import distlab
from distlab.core.processes import signal_quietly

SECTIONS = ("launch", "grader", "compose", "checkpoint", "inputs")


@dataclass
class Row:
    section: str
    fault: str
    outcome: str
    seconds: float
    detail: str


ROWS: list[Row] = []


def record(section: str, fault: str, outcome: str, start: float, detail: str = "") -> None:
    detail = " ".join(detail.split())
    ROWS.append(Row(section, fault, outcome, time.perf_counter() - start, detail[:110]))
    print(f"  {section:<10} {fault:<44} {outcome:<13} {ROWS[-1].seconds:7.2f}", flush=True)


def alive_with(mark: str) -> list[int]:
    """Live processes whose command line holds ``mark``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and mark.encode() in (entry / "cmdline").read_bytes()
                and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_until_gone(mark: str, bound_s: float) -> list[int]:
    deadline = time.monotonic() + bound_s
    while alive_with(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = alive_with(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


# ------------------------------------------------------------------- launch ---
def _noop(rank, world_size):
    return rank


def _raises(rank, world_size):
    if rank == 1:
        raise ValueError("injected")
    return rank


def _exits(rank, world_size):
    if rank == 1:
        os._exit(3)
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))


def _killed(rank, world_size):
    import signal as sig

    if rank == 1:
        os.kill(os.getpid(), sig.SIGKILL)
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))


def _sleeps(rank, world_size):
    if rank == 1:
        time.sleep(3600)
    return rank


def _escapes(rank, world_size, mark):
    subprocess.Popen(["sleep", mark], start_new_session=True)
    return rank


def _mixed(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.collectives import ring_all_reduce

    if rank == 0:
        ring_all_reduce(torch.ones(4))
    else:
        dist.all_reduce(torch.ones(4))


def _outsider(rank, world_size):
    import torch
    import torch.distributed as dist

    from distlab.collectives import ring_all_reduce

    pair = dist.new_group([0, 1])
    if rank == 2:
        ring_all_reduce(torch.ones(4), group=pair)


def launch_faults() -> None:
    distlab.run(_noop, 4)  # warm workers: the seconds below are the faults', not start-up
    for name, fn, want in [
        ("a rank raises", _raises, "ValueError"),
        ("a rank exits (os._exit)", _exits, "ProcessDied"),
        ("a rank is SIGKILLed", _killed, "ProcessDied"),
        ("a collective on a group the rank is not in", _outsider, "ValueError"),
    ]:
        start = time.perf_counter()
        world = 3 if fn is _outsider else 4
        try:
            distlab.run(fn, world, timeout=60, show_output=False)
            record("launch", name, "wrong", start, "no error")
        except distlab.RankError as error:
            ok = error.exc_type == want
            record("launch", name, "clean" if ok else "wrong", start, str(error).splitlines()[0])
        except distlab.LaunchTimeoutError as error:
            record("launch", name, "hang", start, str(error).splitlines()[0])
    for name, fn in [
        ("a rank sleeps forever", _sleeps),
        ("distlab ring vs torch all_reduce", _mixed),
    ]:
        start = time.perf_counter()
        try:
            distlab.run(fn, 2, timeout=5, show_output=False)
            record("launch", name, "wrong", start, "no error")
        except distlab.LaunchTimeoutError as error:
            named = all(error.collectives.values()) if fn is _mixed else True
            lines = str(error).splitlines()
            record(
                "launch", name, "clean" if named else "wrong", start,
                f"timeout as set (5 s); {lines[-2] if fn is _mixed else lines[1]}",
            )  # fmt: skip
    mark = f"3600.{uuid.uuid4().int % 10**9:09d}"
    start = time.perf_counter()
    distlab.run(_escapes, 2, args=(mark,))
    left = wait_until_gone(mark, 10)
    record(
        "launch", "a job's child in a session of its own", "left running" if left else "clean",
        start, f"{len(left)} left 10 s after the job" if left else "ended with the job",
    )  # fmt: skip
    start = time.perf_counter()
    try:
        distlab.run(_raises, 10**6)
        record("launch", "world_size = 10**6", "wrong", start)
    except ValueError as error:
        record("launch", "world_size = 10**6", "refused", start, str(error))


# ------------------------------------------------------------------- grader ---
CONFIG = """c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "faults"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
"""


def _course(folder: Path, mark: str) -> Path:
    """A one-notebook course whose test cell starts two `sleep`s (one in a session of its
    own), a launcher job, and then waits; returns the notebook."""
    source = (
        "import subprocess, time, distlab\n"
        f"subprocess.Popen(['sleep', '{mark}'])\n"
        f"subprocess.Popen(['sleep', '{mark}'], start_new_session=True)\n"
        "distlab.run(lambda r, w: r, 2)  # the launcher's starter and workers stay warm\n"
        "time.sleep(3600)\n"
    )
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "grade": True, "grade_id": "test-wait", "locked": True, "points": 1,
        "schema_version": 3, "solution": False, "task": False,
    }  # fmt: skip
    notebook = nbformat.v4.new_notebook(cells=[cell])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = folder / "solutions" / "90-faults" / "90-faults.ipynb"
    path.parent.mkdir(parents=True)
    (folder / "nbgrader_config.py").write_text(CONFIG)
    nbformat.write(notebook, path)
    return path


def _tagged_left(scratch: Path) -> list[int]:
    """Processes whose TMPDIR lies in ``scratch``: the grader's children."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(scratch).encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def grader_faults() -> None:
    for name, signum, whole_group in [
        ("distlab grade: SIGKILL (the grader alone)", signal.SIGKILL, False),
        ("distlab grade: SIGKILL (its whole group)", signal.SIGKILL, True),
        ("distlab grade: SIGTERM", signal.SIGTERM, True),
        ("distlab grade: Ctrl+C (SIGINT)", signal.SIGINT, True),
    ]:
        with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
            folder, mark = Path(tmp), f"3600.{uuid.uuid4().int % 10**9:09d}"
            notebook = _course(folder, mark)
            scratch = folder / "tmp"
            scratch.mkdir()
            env = {**os.environ, "TMPDIR": str(scratch)}
            grader = subprocess.Popen(
                [sys.executable, "-m", "distlab.cli", "grade", str(notebook), "--course-root",
                 str(folder)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
            while len(alive_with(mark)) < 2 and grader.poll() is None:
                time.sleep(0.2)
            time.sleep(1.0)  # the launcher's workers are up
            start = time.perf_counter()
            if whole_group:
                os.killpg(grader.pid, signum)
            else:
                os.kill(grader.pid, signum)
            grader.wait()
            deadline = time.monotonic() + 5
            while (_tagged_left(scratch) or alive_with(mark)) and time.monotonic() < deadline:
                time.sleep(0.05)
            ended = time.perf_counter()
            left = _tagged_left(scratch) + alive_with(mark)
            folders = list(scratch.iterdir())
            for pid in left:
                signal_quietly(pid, signal.SIGKILL)
            outcome = "left running" if left or folders else "clean"
            detail = f"{len(left)} processes, {len(folders)} folders left after 5 s"
            ROWS.append(Row("grader", name, outcome, ended - start, detail))
            print(f"  {'grader':<10} {name:<44} {outcome:<13} {ended - start:7.2f}", flush=True)


# --------------------------------------------------------------- checkpoint ---
def _save_steps(rank, world_size, folder):
    from distlab.models import GPT, GPTConfig
    from distlab.parallel import save_sharded
    from distlab.parallel.data import training as T

    trainer = T.build("zero1", GPT(GPTConfig(layers=1), seed=0), algorithm="builtin", lr=1e-2)
    for step in (2, 4, 6):
        save_sharded(f"{folder}/step-{step}", trainer.model, trainer.optimizer)


def _restart(rank, world_size, folder):
    import warnings

    from distlab.parallel.checkpoint.data_parallel import latest_verified_checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = latest_verified_checkpoint(folder)
    return found[0] if found else None, [str(w.message) for w in caught]


def checkpoint_faults() -> None:
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        try:
            distlab.run(_save_steps, 2, args=(tmp,))
        except Exception as error:  # noqa: BLE001 - a row, not a crash of the table
            record("checkpoint", "save three steps", "wrong", time.perf_counter(), repr(error))
            return
        shard = min(
            p for p in (Path(tmp) / "step-6").rglob("*") if p.is_file() and p.name != "COMMIT.json"
        )
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        start = time.perf_counter()
        step, said = distlab.run(_restart, 2, args=(tmp,))[0]
        outcome = "clean" if step == 4 and said else "wrong"
        record("checkpoint", "a bit flipped in the newest step", outcome, start,
               f"restarts from step {step}; {said[0] if said else 'no warning'}")  # fmt: skip


# ------------------------------------------------------------------- inputs ---
CLI = ["-m", "distlab.cli"]
#: Inputs that get an answer: the bubble's closed forms for any size, and a whole float as
#: an int (checks.int_in's rule); every other input below must be refused.
ANSWERED = ("distlab bubble --stages 99999999999", "Layout(zero_stage=1.0)")
CARDS = ["-m", "flashcards.cli"]


def input_faults() -> None:
    """Bad values given to the CLI and the API, each in a subprocess with a time bound."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")
    )
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        deck = Path(tmp) / "bomb.yaml"
        deck.write_text(bomb)
        garbage = Path(tmp) / "reviews.db"
        garbage.write_bytes(os.urandom(4096))
        layout = "from distlab.core.layout import Layout; "
        cases = [
            ("distlab bubble --stages 99999999999",
             CLI + ["bubble", "--stages", "99999999999", "--micro-batches", "8"], {}),
            ("flashcards list --deck <YAML alias bomb>",
             CARDS + ["list", "--deck", str(deck)], {}),
            ("flashcards with a review store that is garbage", CARDS + ["list"],
             {"DISTLAB_FLASHCARDS_DB": str(garbage)}),
            ("flashcards export-anki /nonexistent-dir/x.apkg",
             CARDS + ["export-anki", "/nonexistent-dir/x.apkg"], {}),
            ("flashcards list --tag no-such-tag", CARDS + ["list", "--tag", "no-such-tag"], {}),
            ("distlab place --order tp-pp", CLI + ["place", "--order", "tp-pp"], {}),
            ("Layout(tp=10**30)", ["-c", layout + "Layout(tp=10**30)"], {}),
            ("Layout(zero_stage=1.0)", ["-c", layout + "stage = Layout(zero_stage=1.0).zero_stage"
             "; assert type(stage) is int, stage; print('stored as the int', stage)"], {}),
            ("Layout(2, 2)", ["-c", layout + "Layout(2, 2)"], {}),
            ("distlab.run(f, 2, timeout=inf)",
             ["-c", "import distlab; distlab.run(print, 2, timeout=float('inf'))"], {}),
            ("distlab.run(f, 2, args=5)", ["-c", "import distlab; distlab.run(print, 2, args=5)"],
             {}),
        ]  # fmt: skip
        for name, argv, extra in cases:
            start = time.perf_counter()
            env = {**os.environ, "DISTLAB_FLASHCARDS_DB": str(Path(tmp) / "fresh.db"), **extra}
            try:
                done = subprocess.run(
                    [sys.executable, *argv], check=False, capture_output=True, text=True, timeout=60,
                    env=env, cwd=tmp,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                record("inputs", name, "hang", start, "still running after 60 s")
                continue
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            last = said[-1] if said else ""
            if name in ANSWERED:  # a right answer at once is the fix, not a refusal
                outcome = "clean" if done.returncode == 0 else "wrong"
            elif done.returncode == 0:
                outcome = "wrong"
            elif "Traceback" in done.stderr and not name.startswith(("Layout", "distlab.run")):
                outcome = "wrong"  # a CLI must say one line, not trace back
            else:
                outcome = "refused"
            if "nonexistent-dir" in name and Path("/nonexistent-dir").exists():
                outcome, last = "wrong", "created /nonexistent-dir"
            record("inputs", name, outcome, start, last)


# ------------------------------------------------------------------ compose ---
def compose_faults() -> None:
    from distlab.core.layout import Layout
    from distlab.models import GPT, GPTConfig, gpt_batch

    def case(name, change):
        def fn(rank, world_size):
            from distlab.parallel.compose import train

            config = GPTConfig(layers=2)
            tokens, targets = gpt_batch(8, config)
            kwargs = {"steps": 2, "lr": 0.1}
            layout = Layout(tp=2, dp=2)
            if rank == world_size - 1:
                layout, tokens, kwargs = change(layout, tokens, kwargs)
            return train(GPT(config, seed=0), layout, tokens, targets, **kwargs).losses

        start = time.perf_counter()
        try:
            distlab.run(fn, 4, timeout=60, show_output=False)
            record("compose", name, "wrong", start, "trained without an error")
        except distlab.RankError as error:
            first = [line for line in str(error).splitlines() if "differ" in line]
            record("compose", name, "refused" if first else "wrong", start,
                   first[0] if first else str(error).splitlines()[0])  # fmt: skip
        except distlab.LaunchTimeoutError:
            record("compose", name, "hang", start, "ran into the 60 s timeout")

    def other_batch(layout, tokens, kwargs):
        tokens = tokens.clone()
        tokens[0, 0] = (tokens[0, 0] + 1) % 64
        return layout, tokens, kwargs

    case("one rank trains on another batch", other_batch)
    case("one rank has another lr", lambda lo, t, k: (lo, t, {**k, "lr": 0.2}))
    case("one rank has another step count", lambda lo, t, k: (lo, t, {**k, "steps": 3}))
    case("one rank has another layout", lambda lo, t, k: (Layout(tp=1, dp=4), t, k))
    case("one rank has another optimizer", lambda lo, t, k: (lo, t, {**k, "optimizer": "adam"}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    only = parser.parse_args().only.split(",")
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    print("firing faults (section, fault, outcome, seconds):")
    for section, fire in [
        ("launch", launch_faults), ("compose", compose_faults),
        ("checkpoint", checkpoint_faults), ("inputs", input_faults), ("grader", grader_faults),
    ]:  # fmt: skip
        if section in only:
            fire()
    distlab.shutdown()
    print()
    print(f"| {'section':<10} | {'fault':<44} | {'outcome':<12} | {'s':>6} | what it said |")
    print(f"|{'-' * 12}|{'-' * 46}|{'-' * 14}|{'-' * 8}|---|")
    for row in ROWS:
        print(f"| {row.section:<10} | {row.fault:<44} | {row.outcome:<12} | {row.seconds:6.2f} "
              f"| {row.detail} |")  # fmt: skip
    counts = {}
    for row in ROWS:
        counts[row.outcome] = counts.get(row.outcome, 0) + 1
    print("\n" + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))


if __name__ == "__main__":
    main()
