"""The ``distlab`` subcommands that are not grading: one module per tool.

* :mod:`~distlab.commands.bench`: ``distlab bench`` (collectives on real processes);
* :mod:`~distlab.commands.sim`: ``distlab sim`` (the alpha-beta simulator);
* :mod:`~distlab.commands.calc`: ``distlab memory``, ``distlab bubble``, ``distlab plan``;
* :mod:`~distlab.commands.placement`: ``distlab place``, ``distlab schedule``;
* :mod:`~distlab.commands.progress`: ``distlab progress`` (grades, checks and flashcards
  due per notebook; ``distlab.progress_table()`` in a notebook);
* :mod:`~distlab.commands.course`: ``distlab course start`` (a work folder of released
  notebooks), ``distlab course upgrade`` (a copy carried into the current release).

Each module has ``register(subparsers)``; :mod:`distlab.cli` wires them up. They
sit on the top floor: they read every layer below and nothing imports them.
"""
