"""Wrong answers to notebook 01's exercises."""

ASSIGNMENT = "01-memory-anatomy"
RETURN_BYTES = (
    "    return (DTYPE_BYTES[weights] + DTYPE_BYTES[grads] + master\n"
    "            + states_per_param[optimizer] * update_dtype_bytes)"
)
BACKWARD = "    delta_out = out - target  # dL/d(out)"
LOSS = "        loss = nn.functional.mse_loss(model(x), y) / micro_batches"

MUTANTS = {
    "bytes-per-parameter": [
        (
            "looks the answer up in the library's recipes",
            [
                (
                    RETURN_BYTES,
                    (
                        "    name = ('mixed_adam' if master_weights else\n"
                        "            'fp32_adam' if weights == 'fp32' else 'bf16_adam')\n"
                        "    if optimizer != 'adam':\n"
                        "        name = optimizer\n"
                        "    return memory.get_recipe(name).bytes_per_param"
                    ),
                )
            ],
        ),
        ("forgets the fp32 master copy", [("    master = 4 if master_weights else 0", "    master = 0")]),
        (
            "keeps optimizer states in the weights' dtype even with masters",
            [
                (
                    "    update_dtype_bytes = 4 if master_weights else DTYPE_BYTES[weights]",
                    "    update_dtype_bytes = DTYPE_BYTES[weights]",
                )
            ],
        ),
        (
            "optimizer states always fp32",
            [
                (
                    "    update_dtype_bytes = 4 if master_weights else DTYPE_BYTES[weights]",
                    "    update_dtype_bytes = 4",
                )
            ],
        ),
        (
            "gradients counted in the weights' dtype",
            [(RETURN_BYTES, RETURN_BYTES.replace("DTYPE_BYTES[grads]", "DTYPE_BYTES[weights]"))],
        ),
        (
            "unknown optimizer counted as stateless",
            [
                ("    if optimizer not in states_per_param:\n", "    if False:\n"),
                ("states_per_param[optimizer]", "states_per_param.get(optimizer, 0)"),
            ],
        ),
    ],
    "manual-backward": [
        (
            "calls autograd",
            [
                (
                    "    h = x @ w1.T\n",
                    (
                        "    with torch.enable_grad():\n"
                        "        x, w1, w2 = (t.detach().clone().requires_grad_() for t in (x, w1, w2))\n"
                        "        (0.5 * ((x @ w1.T @ w2.T - target) ** 2).sum()).backward()\n"
                        "    return w1.grad, w2.grad, x.grad\n"
                        "    h = x @ w1.T\n"
                    ),
                )
            ],
        ),
        ("drops the 0.5 (factor 2)", [(BACKWARD, "    delta_out = 2 * (out - target)")]),
        ("wrong sign of the error", [(BACKWARD, "    delta_out = target - out")]),
        (
            "transposed weight gradient",
            [("    grad_w2 = delta_out.T @ h", "    grad_w2 = (h.T @ delta_out).reshape(w2.shape)")],
        ),
        (
            "grad_w1 from the hidden activation instead of the input",
            [("    grad_w1 = delta_h.T @ x", "    grad_w1 = delta_h.T @ h")],
        ),
    ],
    "accumulate-gradients": [
        (
            "calls the library's accumulation",
            [
                (
                    "    model.zero_grad()\n",
                    (
                        "    model.zero_grad()\n"
                        "    from distlab.parallel import accumulate_gradients as library\n"
                        "    library(model, lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),\n"
                        "            list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches))))\n"
                        "    return\n"
                    ),
                )
            ],
        ),
        ("does not divide by the number of micro-batches", [(LOSS, "        loss = nn.functional.mse_loss(model(x), y)")]),
        ("keeps the stale gradients", [("    model.zero_grad()\n", "")]),
        (
            "runs the whole batch at once",
            [
                (
                    "    for x, y in zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)):",
                    "    for x, y in [(inputs, targets)]:",
                ),
                (LOSS, "        loss = nn.functional.mse_loss(model(x), y)"),
            ],
        ),
        (
            "divides by the micro-batch size instead",
            [(LOSS, "        loss = nn.functional.mse_loss(model(x), y) / len(x)")],
        ),
        (
            "no check that the batch splits evenly",
            [("    if micro_batches < 1 or inputs.shape[0] % micro_batches:", "    if micro_batches < 1:")],
        ),
    ],
}
