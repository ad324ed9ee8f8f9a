"""Every number a notebook's prose states is tied, printed or cited (distlab.site.stated_numbers).

The fast tests read the solution notebooks only: what counts as a stated number, how a
printed number is matched, and every tie a markdown cell records (its expression is
evaluated with the deck's evaluator, so a library change that moves a stated number fails
here, naming notebook, cell and number). Whether the numbers left are printed needs the
notebooks' outputs: :func:`test_every_stated_number_is_checked` reads the executed copies the
last course run kept (``.pytest_cache/d/executed-notebooks``) when they ran today's
notebooks, and is skipped otherwise; ``tests/test_course.py`` runs the same check, in the
slow tier, on the execution it grades, so CI always checks it.
"""

from __future__ import annotations

import nbformat
import pytest

from distlab.core.course import assignment_names, find_course_root, source_notebook
from distlab.site import executed
from distlab.site.prose_numbers import stated_numbers
from distlab.site.stated_numbers import (
    check_notebook,
    numbers_in,
    table,
    tie_problems,
)
from flashcards.model import Check

ROOT = find_course_root()
ASSIGNMENTS = assignment_names(ROOT)


def _texts(markdown: str) -> list[str]:
    return [n.text for n in stated_numbers(markdown)]


# ------------------------------------------------------------- what counts as stated ---
@pytest.mark.parametrize(
    "markdown, stated",
    [
        ("ZeRO-1 on 8 GPUs leaves 5.5 bytes per parameter, not 9.", ["5.5"]),
        ("A 1,440 MiB ring against 960 MiB.", ["1,440", "960"]),
        ("Stage 1 tends to a 4x saving and 2 bytes more.", ["4", "2"]),
        ("A 7B model and 15.8 % of the step; 9.8e-4 in float16.", ["7", "15.8", "9.8e-4"]),
        ("notebook 04, notebooks 03 and 06, Section 3.1, Table 2, Exercise 1.", []),
        ("Narayanan et al. 2021 (arXiv:2104.04473) and (Rajbhandari et al., 2020).", []),
        ("H100, fp32, ZeRO-3, GPT-3, 1F1B, 3D, PCIe 4.0, Llama 3, 16-bit, x16.", []),
        ("rank 0 holds layers 1-2 and 9-10; stage 3 shards.", []),
        ("2 processes on 8 GPUs", []),
        ("`model_state_bytes(7e9, dp=8)` and `16Ψ = 208 GB`", ["208"]),
        ("$2(n-1)\\alpha$ and 10⁹ bytes", []),
        ("## 12 Heading\n\n1. first\n2. second", []),
        ('a claim that "ZeRO-2 sends 50 % less" is wrong; it sends 100 %', ["100"]),
        ("[link](#Section-12) and <img width=400>, CACM 31(5)", []),
    ],
)
def test_what_counts_as_a_stated_number(markdown, stated):
    assert _texts(markdown) == stated


def test_a_number_reads_as_its_rounded_and_scaled_forms():
    one_and_half, tokens, micro_s, percent = stated_numbers(
        "1.5 times, about 18,500 tokens, 79 µs and 40 %"
    )
    assert one_and_half.reads_as(1.46) and not one_and_half.reads_as(1.44)
    assert tokens.reads_as(18_456) and not tokens.reads_as(18_400)
    assert micro_s.reads_as_scaled(7.9e-5) and not micro_s.reads_as_scaled(7.9e-4)
    assert percent.reads_as_scaled(0.4)
    assert not one_and_half.reads_as_scaled(1500)  # no unit, no prefix


# ------------------------------------------------------------------------------ ties ---
SOURCE = "Stage 1 leaves 5.5 bytes per parameter, not 7.25 or 12 bytes."


def _tie(text: str, expr: str, value: float) -> Check:
    return Check(expr=expr, value=value, text=text)


def test_a_tie_that_holds_has_no_problem():
    numbers = stated_numbers(SOURCE)
    expr = "calc.memory.model_state_bytes(1, recipe='mixed_adam', zero_stage=1, dp=8).total"
    assert tie_problems(_tie("5.5 bytes", expr, 5.5), SOURCE, numbers) == []
    assert [n.text for n in numbers_in("5.5 bytes", SOURCE, numbers)] == ["5.5"]


@pytest.mark.parametrize(
    "tie, problem",
    [
        (_tie("5.5 bytes", "5.4", 5.5), "5.4"),  # the expression gives another number
        (_tie("5.5 bytes", "5.4", 5.4), "does not read as '5.5'"),  # value is not the text's
        (_tie("7.25 or 12", "12", 12), "exactly one stated number"),
        (_tie("Stage 1", "1", 1), "exactly one stated number"),
        (_tie("5.5 bytes", "calc.no_such_module.f()", 5.5), "raised"),
    ],
)
def test_a_tie_that_fails_says_why(tie, problem):
    problems = tie_problems(tie, SOURCE, stated_numbers(SOURCE))
    assert len(problems) == 1 and problem in problems[0], problems


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_tie_gives_its_number(assignment):
    """Each tie recorded in a markdown cell's metadata holds: its text states one number, and
    its expression gives that number (within its rel_tol)."""
    report = check_notebook(_source(assignment), assignment)
    assert not report.tie_problems, "\n".join(report.tie_problems)


# ------------------------------------------------------------------ every number ---
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_stated_number_is_checked(assignment):
    """Each number is tied, printed by (or written in) a code cell of its section, or cited
    with its section: none unchecked. Needs the notebook's outputs (see the module's doc)."""
    ran_path = executed.find(ROOT, assignment, executed.default_folders(ROOT))
    if ran_path is None:
        pytest.skip(
            f"no executed copy of today's {assignment}: tests/test_course.py checks it in "
            "the slow tier (or run python -m distlab.site.stated_numbers --run)"
        )
    report = check_notebook(_source(assignment), assignment, nbformat.read(ran_path, as_version=4))
    assert not report.count("unchecked"), table([report])


def _source(assignment: str):
    return nbformat.read(source_notebook(ROOT, assignment), as_version=4)


def test_each_verdict_on_a_small_notebook():
    """A tie and its inputs, a number printed in its section, one written in the code, one
    restated by a summary (a section without code), and one nothing checks."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    tie = {
        "text": "42×",
        "expr": "calc.scaling.amdahl_speedup(0.02, 256)",
        "value": 42,
        "rel_tol": 0.01,
    }
    nb = new_notebook(
        cells=[
            new_markdown_cell(
                "## Amdahl\n\n2% serial on 256 GPUs caps the speed-up at 42×.",
                id="m1",
                metadata={"distlab": {"numbers": [tie]}},
            ),
            new_code_cell(
                "tokens = 4096\nprint(1.46)", id="c1", outputs=[new_output("stream", text="1.46\n")]
            ),
            new_markdown_cell(
                "It sends 1.5 times as much over 4096 tokens, and 61.75 GB.", id="m2"
            ),
            new_markdown_cell("## Summary\n\n- 1.46 seconds, as printed above.", id="m3"),
        ]
    )
    report = check_notebook(nb, "toy", nb)
    verdicts = {(v.number.cell, v.number.text): v.how for v in report.verdicts}
    assert verdicts == {
        ("m1", "2"): "tied",  # an input of the tie's expression (0.02)
        ("m1", "256"): "tied",
        ("m1", "42"): "tied",
        ("m2", "1.5"): "printed",  # 1.46, in its section
        ("m2", "4096"): "printed",  # written in the code cell
        ("m2", "61.75"): "unchecked",
        ("m3", "1.46"): "printed",  # a summary: anywhere in the notebook
    }
    assert report.tie_problems == []
