"""Wrong answers to notebook 12's exercises."""

ASSIGNMENT = "12-designing-a-training-run"
FIRST = "    c, problems = layout, []\n"
SEARCH_END = "    c = chosen.layout\n"

MUTANTS = {
    "layout-problems": [
        (
            "asks the planner",
            [
                (
                    FIRST,
                    "    if plan(model, cluster, global_batch=global_batch).estimate_for(layout) is None:\n"
                    "        return ['the planner rejects it']\n"
                    "    return []\n" + FIRST,
                )
            ],
        ),
        (
            "checks the query heads only, not the key/value heads",
            [('("kv_heads", model.kv_heads or model.heads),', "")],
        ),
        (
            "the whole GPU memory, no headroom",
            [
                (
                    "cluster.gpu_memory_bytes * (1 - PlannerAssumptions().memory_headroom)",
                    "cluster.gpu_memory_bytes",
                )
            ],
        ),
        (
            "forbids every ZeRO stage with pipeline parallelism",
            [("    if c.zero_stage > 1 and c.pp > 1:", "    if c.zero_stage > 0 and c.pp > 1:")],
        ),
        (
            "interleaving without the layers-per-stage rule",
            [
                (
                    "\n                                 or (model.layers // c.pp) % c.virtual_stages)",
                    ")",
                )
            ],
        ),
        (
            "forgets the global batch",
            [("    if c.dp * c.micro_batch * c.micro_batches != global_batch:", "    if False:")],
        ),
    ],
    "design-run": [
        (
            "the planner's best layout",
            [
                (
                    "    chosen = None\n",
                    (
                        "    chosen = plan(spec, cluster, global_batch=global_batch).best\n"
                        "    divisors = []\n"
                    ),
                )
            ],
        ),
        (
            "the visible run's plan for every model",
            [("    chosen = None\n", "    chosen = PLAN.best\n    divisors = []\n")],
        ),
        (
            "bubble relative to the ideal step",
            [
                (
                    "virtual_stages=c.virtual_stages)\n    run_s",
                    "virtual_stages=c.virtual_stages, relative_to='ideal')\n    run_s",
                )
            ],
        ),
        (
            "memory in GiB",
            [("peak_memory(spec, c).total / 1e9", "peak_memory(spec, c).total / 2**30")],
        ),
        ("days from hours", [('"days": run_s / 86400', '"days": run_s / 3600')]),
        (
            "the layout that needs the least memory, not the fastest",
            [
                (
                    "est.step_s < chosen.step_s",
                    "est.memory.total < chosen.memory.total",
                )
            ],
        ),
        (
            "a justification without its numbers",
            [
                (
                    """f"{memory_gb:.1f} GB per GPU, bubble {bubble:.1%}, step {chosen.step_s:.2f} s, "
                f"MFU {chosen.mfu:.1%}: the fastest layout that fits\"""",
                    """"it fits in memory, keeps the bubble small and runs at a good MFU\"""",
                )
            ],
        ),
        (
            "a justification with memory and MFU right but a made-up bubble, step and run length",
            [
                (
                    """f"{memory_gb:.1f} GB per GPU, bubble {bubble:.1%}, step {chosen.step_s:.2f} s, "
                f"MFU {chosen.mfu:.1%}: the fastest layout that fits\"""",
                    """f"{memory_gb:.1f} GB per GPU, MFU {chosen.mfu:.1%}, a 5 % bubble, 9 s steps "
                "and 50 days\"""",
                )
            ],
        ),
        (
            "a justification that states the bubble against the ideal time",
            [
                (
                    "bubble {bubble:.1%}, step",
                    "bubble {(c.pp - 1) / (c.micro_batches * c.virtual_stages):.2%}, step",
                )
            ],
        ),
        (
            "MFU in percent",
            [('"mfu": chosen.mfu,', '"mfu": 100 * chosen.mfu,')],
        ),
    ],
}
