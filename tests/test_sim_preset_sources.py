"""Every figure of a cluster preset says where it comes from (issue 11, section 4).

The latencies (alpha: 2 us NVLink, 5 us InfiniBand, 30 us TCP) and the achieved PCIe rates
(25 GB/s near, 12 GB/s across sockets) are not published anywhere: they must be labelled as
assumptions in the preset (``distlab.sim.topology.LINK_SOURCES``), in the cards that state
them and in notebook 03. A bandwidth labelled ``source: hardware.X`` must be that data-sheet
figure.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from distlab.sim import hardware
from distlab.sim.topology import LINK_SOURCES, PRESETS
from flashcards.model import load_deck

ROOT = Path(__file__).resolve().parents[1]
PRESET_LINKS = {
    link.name: link
    for cluster in PRESETS.values()
    for link in (cluster.intra, cluster.far_intra, cluster.inter)
    if link is not None
}
ASSUMED = {
    ("NVLink", "alpha"),
    ("InfiniBand", "alpha"),
    ("Ethernet", "alpha"),
    ("PCIe 4.0 x16, same PCIe switch", "bandwidth"),
    ("PCIe 4.0 across CPU sockets", "bandwidth"),
}


@pytest.mark.parametrize("name", sorted(PRESET_LINKS))
def test_every_preset_figure_is_sourced_or_labelled_an_assumption(name):
    labels = LINK_SOURCES.get(name)
    assert labels is not None, f"preset link {name!r} has no entry in LINK_SOURCES"
    assert set(labels) == {"alpha", "bandwidth"}, labels
    for figure, label in labels.items():
        assert label.startswith(("source: ", "assumption: ")), (name, figure, label)
    for part, figure in ASSUMED:
        if part in name:
            assert labels[figure].startswith("assumption: "), (name, figure, labels[figure])


@pytest.mark.parametrize("name", sorted(PRESET_LINKS))
def test_a_sourced_bandwidth_is_the_data_sheet_figure(name):
    label = LINK_SOURCES[name]["bandwidth"]
    if not label.startswith("source: hardware."):
        pytest.skip(f"{name}: {label}")
    constant = label.removeprefix("source: hardware.").split()[0]
    assert PRESET_LINKS[name].bandwidth == getattr(hardware, constant).bandwidth


def test_cards_that_state_an_assumed_figure_say_so():
    assumed = re.compile(r"\.alpha\b|PCIE4_NEAR\.bandwidth|far_intra\.bandwidth")
    unlabelled = []
    for card in load_deck():
        states_one = any(assumed.search(c.expr) for c in card.checks)
        states_one = states_one or r"\alpha = 2\,\mu s" in card.q + card.a
        if states_one and "assum" not in (card.q + card.a).lower():
            unlabelled.append(card.slug)
    assert not unlabelled, f"cards state an assumed preset figure without saying so: {unlabelled}"


def test_notebook_03_prints_each_links_label():
    path = ROOT / "solutions" / "03-algorithms-and-cost" / "03-algorithms-and-cost.ipynb"
    cells = nbformat.read(path, as_version=4).cells
    printing = [c for c in cells if c.cell_type == "code" and "LINK_SOURCES[" in c.source]
    assert printing, "notebook 03 should print LINK_SOURCES next to the preset links"
    index = cells.index(printing[0])
    assert "assumption" in cells[index - 1].source, "the text above it names the assumptions"
