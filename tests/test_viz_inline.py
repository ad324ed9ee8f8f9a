"""A distlab figure shows as an image in a notebook kernel, with no pyplot imported anywhere.

The figures are made with ``Figure(...)`` (no pyplot state), so no inline backend draws
them; ``distlab.viz`` registers the PNG formatter itself. Without it the cell shows the
text ``<Figure size ...>`` (seen in notebook 02 when collective_plots stopped using pyplot).
"""

import nbformat
import pytest
from nbclient import NotebookClient

from distlab.grading.sockets import use_private_sockets

CELL = """\
import sys
from distlab.viz import collective_plots
fig = collective_plots.plot_collective("all_reduce", world_size=4)
assert "matplotlib.pyplot" not in sys.modules, "the test must run without pyplot"
fig
"""


@pytest.mark.slow
def test_a_viz_figure_renders_as_png_without_pyplot(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    resources = {"metadata": {"path": tmp_path}}
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources)
    client.km = client.create_kernel_manager()
    use_private_sockets(client.km)  # no TCP port another test's process could take first
    client.execute()
    outputs = nb.cells[0].outputs
    assert any("image/png" in out.get("data", {}) for out in outputs), outputs


def test_outside_ipython_nothing_is_registered():
    from distlab.viz import show_figures_inline

    assert show_figures_inline() is False
