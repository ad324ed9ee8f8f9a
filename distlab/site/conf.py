"""Sphinx configuration of the course site (read by :func:`distlab.site.build.build`).

Sphinx with MyST-NB reads the generated sources (notebook pages, deck pages, library pages)
and the hand-written pages of ``docs/``; the theme is sphinx-book-theme (Jupyter Book 1's);
search is Sphinx's own (an index shipped with the pages). Nothing is fetched while a page
is built or read: the notebooks are not executed here (their outputs are already in them),
and MathJax 3 is the copy the ``django-static-mathjax`` package installs (MathJax's own
files, no Django needed), served from ``_static/mathjax/`` (Sphinx would load it from a CDN).

Heading anchors are the flashcards' section anchors
(:func:`flashcards.course_order.section_anchor`: ``"## 1F1B"`` -> ``#1f1b``), so a card's
``notebook#section`` and the grader's "reread the notebook's section #..." land on the heading.
"""

project = "distlab"
author = "the distlab authors"
copyright = "the distlab authors, MIT licence"

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.mathjax"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "notebooks/released/**"]
suppress_warnings = ["mystnb.unknown_mime_type"]

# --- notebooks: shown as stored, never run here -------------------------------------
nb_execution_mode = "off"
nb_merge_streams = True  # rank-labelled prints come in many stream chunks
nb_output_stderr = "show"

# --- MyST --------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 6
# by name: Sphinx can cache (pickle) a name, not a function
myst_heading_slug_func = "flashcards.course_order.section_anchor"

# --- autodoc -------------------------------------------------------------------------
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"

# --- math: a local MathJax 3 (the django-static-mathjax package), no CDN ---------------------
# MyST tells MathJax to typeset only the math it parsed (myst_update_mathjax, its default).
mathjax_path = "mathjax/tex-mml-chtml.js"

# --- HTML --------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "distlab: distributed training you can run"
html_static_path = ["_static"]
html_css_files = ["distlab.css"]
html_favicon = "_static/favicon.svg"  # else the browser asks for /favicon.ico, a 404
html_last_updated_fmt = None
html_show_sourcelink = False
html_copy_source = False  # the sources would double the site's size for no reader
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": False,  # each notebook page links the released notebook itself
    "use_fullscreen_button": False,
    "show_toc_level": 2,
}
html_context = {"default_mode": "light"}  # unset, the theme logs an error in the console
