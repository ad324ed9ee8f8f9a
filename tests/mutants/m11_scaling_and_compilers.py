"""Wrong answers to notebook 11's exercises."""

ASSIGNMENT = "11-scaling-and-compilers"
KARP_FLATT = "    return (1 / speedup - 1 / n) / (1 - 1 / n)"
VERDICT = "    if exposed[worst] >= 0.1 * profile.step_s:"
MFU = "    return per_token * tokens_per_s / (n_gpus * peak_flops_per_gpu)"

MUTANTS = {
    "serial-fraction": [
        ("no division by (1 - 1/n)", [(KARP_FLATT, "    return 1 / speedup - 1 / n")]),
        (
            "the sign the other way",
            [(KARP_FLATT, "    return (1 / n - 1 / speedup) / (1 - 1 / n)")],
        ),
        ("one minus the efficiency", [(KARP_FLATT, "    return 1 - speedup / n")]),
        (
            "Gustafson for the prediction",
            [
                (
                    "scaling.amdahl_speedup(serial_fraction(speedup, n), target_n)",
                    "scaling.gustafson_speedup(serial_fraction(speedup, n), target_n)",
                )
            ],
        ),
        (
            "accepts a speed-up above n",
            [("    if not 0 < speedup <= n:", "    if not 0 < speedup:")],
        ),
        (
            "accepts one worker",
            [
                ("or n < 2:", "or n < 1:"),
                (
                    "    return (1 / speedup",
                    "    if n == 1:\n        return 0.0\n    return (1 / speedup",
                ),
            ],
        ),
    ],
    "bottleneck": [
        (
            "all communication time, overlapped or not",
            [
                (
                    '        "communication": profile.comm_s - profile.overlapped_comm_s,',
                    '        "communication": profile.comm_s,',
                )
            ],
        ),
        ("strictly more than 10%", [(VERDICT, "    if exposed[worst] > 0.1 * profile.step_s:")]),
        (
            "MFU of 30% counted as under-utilisation",
            [("if profile.mfu < 0.3 else", "if profile.mfu <= 0.3 else")],
        ),
        (
            "the MFU test first",
            [
                (
                    VERDICT,
                    "    if profile.mfu < 0.3:\n        return 'under-utilisation'\n" + VERDICT,
                )
            ],
        ),
        (
            "the first overhead over 10%, not the largest",
            [
                (
                    "    worst = max(exposed, key=exposed.get)\n",
                    "    worst = next((k for k, s in exposed.items() if s >= 0.1 * profile.step_s), 'input')\n",
                )
            ],
        ),
    ],
    "run-mfu": [
        (
            "the library's functions, as in the cell above",
            [
                (
                    MFU,
                    (
                        "    return flops.mfu(flops_per_step=flops.training_flops_per_token(n_params) * tokens_per_s,"
                        " step_time_s=1.0, n_gpus=n_gpus, peak_flops_per_gpu=peak_flops_per_gpu)"
                    ),
                )
            ],
        ),
        (
            "6N only, the shape ignored",
            [("        per_token += 12 * layers * hidden * seq_len", "        pass")],
        ),
        (
            "attention as 6 l h s",
            [("12 * layers * hidden * seq_len", "6 * layers * hidden * seq_len")],
        ),
        ("one GPU's peak", [(MFU, "    return per_token * tokens_per_s / peak_flops_per_gpu")]),
        (
            "no check of the arguments",
            [
                (
                    '        if not value > 0:\n            raise ValueError(f"{name} must be positive, got {value!r}")',
                    "        pass",
                )
            ],
        ),
        (
            "2N per token (forward only)",
            [("    per_token = 6 * n_params", "    per_token = 2 * n_params")],
        ),
    ],
}
