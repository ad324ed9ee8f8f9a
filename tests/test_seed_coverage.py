"""benchmarks/seed_coverage.py: the seed list's anchors name real notebook headings (issue 17)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "seed_coverage", ROOT / "benchmarks" / "seed_coverage.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


seed_coverage = _load_benchmark()
ITEMS = seed_coverage.load_items()
HEADINGS = seed_coverage.course_headings(ROOT)
FOLDERS = sorted({a.partition("#")[0] for item in ITEMS for a in item.taught_by})


@pytest.mark.parametrize("folder", FOLDERS)
def test_seed_anchors_into_this_notebook_name_its_headings(folder):
    """Strict for every notebook that exists; a notebook still being written is skipped, and
    becomes strict as soon as its folder is in solutions/."""
    problems = [p for p in seed_coverage.check(ITEMS, HEADINGS) if p.folder == folder]
    if problems and {p.kind for p in problems} == {seed_coverage.MISSING_NOTEBOOK}:
        pytest.skip(f"notebook {folder} not written yet: {len(problems)} seed anchors unchecked")
    assert not problems, "\n".join(map(str, problems))


def test_the_seed_list_is_complete():
    per_seed = {item.seed[:3] for item in ITEMS}
    assert per_seed == {"000", "001", "002", "003", "004"}
    assert len([i for i in ITEMS if i.seed.startswith("004")]) == 89  # the deck's 89 cards
    assert all(i.why for i in ITEMS if not i.taught_by)


def _with_anchor(tmp_path, anchor):
    data = yaml.safe_load(seed_coverage.DATA.read_text(encoding="utf-8"))
    data["seeds"][0]["items"][0]["taught_by"] = [anchor]
    path = tmp_path / "seed_facts.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_strict_fails_on_a_made_up_heading(tmp_path, capsys):
    path = _with_anchor(tmp_path, "02-collectives#no-such-heading")
    assert seed_coverage.main(["--strict", "--data", str(path)]) == 1
    assert "000 #1: missing heading: 02-collectives#no-such-heading" in capsys.readouterr().out
    assert seed_coverage.main(["--data", str(path)]) == 0  # without --strict: reported only


def test_a_misspelt_folder_is_an_error_not_a_notebook_to_wait_for():
    headings = {"07-tensor-and-sequence-parallelism": {"idea"}}
    assert (
        seed_coverage.anchor_problem("07-tensor-parallelism#idea", headings) == "unknown notebook"
    )
    assert seed_coverage.anchor_problem("09-3d-parallelism", headings) == "missing notebook"
    assert seed_coverage.anchor_problem("07-tensor-and-sequence-parallelism", headings) is None


def test_coverage_counts_items_once_and_only_valid_anchors_as_taught_now():
    item = seed_coverage.SeedItem
    items = [
        item("000_a.txt", "1", "x", ("01-a#h", "01-a#g", "02-b")),  # two anchors in 01: counts once
        item("000_a.txt", "2", "y", ("09-later#h",)),  # only a notebook not written yet
        item("001_b.txt", "1", "z", ("01-a#nope",)),  # a heading that does not exist
        item("001_b.txt", "2", "w", (), why="out of scope"),
    ]
    cov = seed_coverage.coverage(items, {"01-a": {"h", "g"}, "02-b": set()})
    assert cov.per_notebook == {"01-a": 2, "02-b": 1, "09-later": 1}
    assert cov.per_seed == {"000_a.txt": (1, 2, 2), "001_b.txt": (0, 1, 2)}
    assert (cov.taught_now, cov.taught_planned, cov.total) == (1, 3, 4)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"taught_by": []}, "say why"),
        ({"gist": ""}, "gist"),
        ({"taught_by": ["02-Collectives#all-reduce"]}, "anchor '02-Collectives#all-reduce'"),
        ({"corrected": 3}, "corrected"),
    ],
)
def test_bad_entries_are_named(tmp_path, change, message):
    data = yaml.safe_load(seed_coverage.DATA.read_text(encoding="utf-8"))
    data["seeds"][0]["items"][0].update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ValueError, match=f"000_08b26b56bc880111.txt item '1'.*{message}"):
        seed_coverage.load_items(path)


def test_a_missing_item_is_noticed(tmp_path):
    data = yaml.safe_load(seed_coverage.DATA.read_text(encoding="utf-8"))
    del data["seeds"][4]["items"][-1]
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ValueError, match="count is 89 but 88 items"):
        seed_coverage.load_items(path)
