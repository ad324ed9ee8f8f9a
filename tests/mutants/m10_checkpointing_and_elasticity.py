"""Wrong answers to notebook 10's exercises."""

ASSIGNMENT = "10-checkpointing-and-elasticity"

_SET_RNG = '    torch.set_rng_state(state["rng"])\n'
_LOAD_OPT = '    optimizer.load_state_dict(state["optimizer"])\n'
_CHECK = "        if not value > 0:"
_DALY = "    return young * (1 + math.sqrt(ratio) / 3 + ratio / 9) - write_s"

MUTANTS = {
    "save-load": [
        ("forgets the random generator", [(_SET_RNG, "")]),
        ("forgets the optimizer state", [(_LOAD_OPT, "")]),
        ("weights only", [(_SET_RNG, ""), (_LOAD_OPT, "")]),
        ("returns the step after the saved one", [('    return state["step"]', '    return state["step"] + 1')]),
        ("starts again from step 0", [('    return state["step"]', "    return 0")]),
        (
            "reseeds from the step instead of restoring the generator",
            [(_SET_RNG, '    torch.manual_seed(state["step"])\n')],
        ),
        ("restores the optimizer but not the weights", [('    model.load_state_dict(state["model"])\n', "")]),
    ],
    "interval": [
        (
            "Young without the factor 2",
            [("    return math.sqrt(2 * write_s * mtbf_s)", "    return math.sqrt(write_s * mtbf_s)")],
        ),
        ("Daly without the '- C'", [(_DALY, "    return young * (1 + math.sqrt(ratio) / 3 + ratio / 9)")]),
        ("Daly without the C >= 2M case", [("    if write_s >= 2 * mtbf_s:\n        return mtbf_s\n", "")]),
        ("Daly returns Young's interval", [(_DALY, "    return young")]),
        (
            "Daly with sqrt(C/M) for sqrt(C/2M)",
            [("    ratio = write_s / (2 * mtbf_s)", "    ratio = write_s / mtbf_s")],
        ),
        ("zero accepted ('< 0' for 'not > 0')", [(_CHECK, "        if value < 0:")]),
        ("checks the write time only", [('(("write_s", write_s), ("mtbf_s", mtbf_s))', '(("write_s", write_s),)')]),
        (
            "a ValueError that names no value",
            [
                (
                    '            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")',
                    '            raise ValueError("times must be positive")',
                )
            ],
        ),
        (
            "Daly checks nothing itself and skips Young",
            [
                (
                    "    young = young_interval(write_s, mtbf_s)  # also checks the values\n",
                    "    young = math.sqrt(2 * write_s * mtbf_s)\n",
                )
            ],
        ),
        (
            "Young by the check cell's grid search",
            [
                (
                    "    return math.sqrt(2 * write_s * mtbf_s)",
                    "    return best_on_grid(lambda t: wasted_fraction(t, write_s, mtbf_s), 1.0, 100 * mtbf_s)",
                )
            ],
        ),
    ],
}
