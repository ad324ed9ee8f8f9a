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
``placement_plots``    a placement on the cluster grid, communication per placement,
                       a scheduler's timeline and waits
=====================  ==============================================================

Import a module to use it (``from distlab.viz import sim_plots``); importing this
package alone does not import matplotlib.
"""
