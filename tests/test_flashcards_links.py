"""The grading link: from a notebook (section) to the flashcard tags and drill command."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import flashcards
from flashcards.model import NOTEBOOK_FOLDERS, load_deck

TEST_DECK = Path(__file__).parent / "data" / "deck"


def test_tags_for_a_notebook_and_a_section():
    deck = load_deck(TEST_DECK)
    assert flashcards.tags_for_notebook("02-collectives", deck) == ["arithmetic", "words"]
    assert flashcards.tags_for_notebook("02-collectives#all-gather", deck) == ["words"]
    assert flashcards.tags_for_notebook(
        "03-algorithms-and-cost", deck, include_difficulty=True
    ) == [
        "advanced",
        "arithmetic",
        "irrational",
    ]
    assert flashcards.tags_for_notebook("11-scaling-and-compilers", deck) == []
    assert [c.slug for c in flashcards.cards_for_notebook("06-zero-and-fsdp", deck)] == [
        "words-zero"
    ]


def test_drill_command_round_trips_through_the_cli_parser():
    command = flashcards.drill_command(notebook="02-collectives#all-reduce", tag="collectives")
    assert command == "flashcards drill --tag collectives --notebook '02-collectives#all-reduce'"
    from flashcards.cli import build_parser

    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.tag, args.notebook) == ("collectives", "02-collectives#all-reduce")
    with pytest.raises(ValueError, match="notebook, a tag"):
        flashcards.drill_command()


def test_every_card_of_the_course_deck_points_at_a_course_notebook():
    deck = load_deck()
    assert {c.notebook_folder for c in deck} <= set(NOTEBOOK_FOLDERS)
    assert all(flashcards.tags_for_notebook(c.notebook, deck) for c in deck)


def test_import_flashcards_is_light():
    code = "import sys, flashcards; print(sorted(m for m in ('fsrs', 'ipywidgets', 'genanki', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
