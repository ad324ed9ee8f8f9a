"""Figures and players, each drawn from the same objects the library computes with.

Every function returns a :class:`matplotlib.figure.Figure` made without pyplot
(``Figure(...)``, then ``fig.subplots``): no global pyplot state, so a figure
shows once, as a notebook cell's value or through ``display``, and tests can
draw without a display. Players return ipywidgets. New plot modules follow the
same idiom and add a line below.

=====================  ==============================================================
module                 what it draws
=====================  ==============================================================
``collective_plots``   a collective's schedule: who holds what after each step, the
                       arrows of each step, a step-by-step player (ring all-reduce)
``cost_plots``         link bandwidths of the presets, alpha/beta cost breakdowns,
                       ``distlab bench`` results
``sim_plots``          simulated time against message size, predicted vs measured
``calc_plots``         memory per ZeRO stage, pipeline bubble vs micro-batches, a
                       pipeline schedule as a Gantt chart
``overlap_plots``      DDP's gradient communication overlapped with backward, step times
``tp_overlap_plots``   the collective matmul: serial and overlapped timelines per rank
``placement_plots``    a placement on the cluster grid, communication per placement,
                       a scheduler's timeline and waits
``pipeline_plots``     pipeline Gantt charts, planned and measured
``style``              what every figure shares: the width a notebook shows, the
                       smallest font, log axes labelled in plain numbers
``legibility``         checks a figure as drawn: no small, overlapping or hatched-over
                       text (``tests/test_figure_legibility.py`` runs it on each one)
=====================  ==============================================================

Import a module to use it (``from distlab.viz import sim_plots``); importing this
package alone does not import matplotlib.

A figure made without pyplot has no inline backend to draw it: in IPython (a notebook
kernel), :func:`show_figures_inline` registers the PNG formatter for
:class:`~matplotlib.figure.Figure` by name, so a figure that is a cell's value, or passed
to ``display``, renders as an image and not as ``<Figure size ...>``. It runs when this
package is imported.
"""

from __future__ import annotations


def show_figures_inline() -> bool:
    """Draw :class:`~matplotlib.figure.Figure` values as PNG in the running IPython kernel.

    Registered by type name (``matplotlib.figure.Figure``), so matplotlib is imported only
    when a figure is first shown. Returns False outside IPython (nothing to do). An inline
    backend set up later (``%matplotlib inline``, ``import matplotlib.pyplot``) registers
    its own formatter for the same type, which then takes over.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    from IPython.core.pylabtools import print_figure

    png = shell.display_formatter.formatters["image/png"]
    png.for_type_by_name(
        "matplotlib.figure", "Figure", lambda fig: print_figure(fig, "png", bbox_inches="tight")
    )
    return True


show_figures_inline()
