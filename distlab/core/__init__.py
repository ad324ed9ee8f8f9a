"""The ground floor: pure Python that every other part of distlab stands on (no torch).

* :mod:`~distlab.core.units`: bytes, GB (1e9) and GiB (2^30), sizes and durations;
* :mod:`~distlab.core.checks`: one rule for every argument check (:func:`~distlab.core.checks.int_in`);
* :mod:`~distlab.core.ranks`: Megatron's rank layout, every process group of a
  tp x cp x ep x dp x pp job;
* :mod:`~distlab.core.collective_schedule`: a collective algorithm as data (steps of transfers);
* :mod:`~distlab.core.pipeline_schedule`: a pipeline schedule as data (actions per rank);
* :mod:`~distlab.core.course`: where the course's notebooks live.

Nothing here imports any other part of distlab (``tests/test_layers.py`` checks it).
"""
