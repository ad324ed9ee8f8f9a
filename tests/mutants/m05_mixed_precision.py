"""Wrong answers to notebook 05's exercises."""

ASSIGNMENT = "05-mixed-precision"
BIAS = "    bias = 2 ** (exponent_bits - 1) - 1"
IEEE_TOP = "        top_exponent, top_fraction = 2 ** exponent_bits - 2 - bias, 2 - eps"
FN_TOP = "        top_exponent, top_fraction = 2 ** exponent_bits - 1 - bias, 2 - 2 * eps"
GROW = "        if self.good_steps == self.growth_interval:"
SCALE_READ = "    scale = scaler.scale  # the scale this backward uses\n"
UNSCALE = "            master.grad = None if p.grad is None else p.grad.float() / scale"

MUTANTS = {
    "format-limits": [
        ("bias off by one (2^(E-1))", [(BIAS, "    bias = 2 ** (exponent_bits - 1)")]),
        (
            "IEEE formats may use the all-ones exponent",
            [(IEEE_TOP, "        top_exponent, top_fraction = 2 ** exponent_bits - 1 - bias, 2 - eps")],
        ),
        (
            "smallest subnormal equals the smallest normal",
            [("smallest_subnormal=math.ldexp(1.0, 1 - bias - mantissa_bits)",
              "smallest_subnormal=math.ldexp(1.0, 1 - bias)")],
        ),
        ("eps as the unit roundoff 2^-(M+1)", [("    eps = 2.0 ** -mantissa_bits", "    eps = 2.0 ** -(mantissa_bits + 1)")]),
        (
            "fn formats keep the all-ones mantissa at the top exponent",
            [(FN_TOP, "        top_exponent, top_fraction = 2 ** exponent_bits - 1 - bias, 2 - eps")],
        ),
        ("ignores ieee=False", [("    if ieee:  # all-ones", "    if True:  # all-ones")]),
        (
            "looks the format up in torch.finfo",
            [
                (
                    BIAS,
                    (
                        "    known = {(5, 10): torch.float16, (8, 23): torch.float32, (11, 52): torch.float64,\n"
                        "             (8, 7): torch.bfloat16, (5, 2): torch.float8_e5m2}\n"
                        "    if not ieee and (exponent_bits, mantissa_bits) == (4, 3):\n"
                        "        return FormatLimits.of(torch.float8_e4m3fn)\n"
                        "    if (exponent_bits, mantissa_bits) in known:\n"
                        "        info = torch.finfo(known[exponent_bits, mantissa_bits])\n"
                        "        return FormatLimits(info.max, info.smallest_normal,\n"
                        "                            info.smallest_normal * info.eps, info.eps)\n"
                        + BIAS
                    ),
                )
            ],
        ),
        (
            "no check of the bit counts",
            [("    if exponent_bits < 2 or mantissa_bits < 1:", "    if exponent_bits < 0:")],
        ),
    ],
    "loss-scaler": [
        (
            "delegates to distlab's DynamicLossScaler",
            [
                (
                    "        self.good_steps = 0\n        ### END SOLUTION",
                    (
                        "        self.good_steps = 0\n"
                        "        self._library = DynamicLossScaler(init_scale, growth_interval=growth_interval,\n"
                        "                                          growth_factor=growth_factor,\n"
                        "                                          backoff_factor=backoff_factor)\n"
                        "        ### END SOLUTION"
                    ),
                ),
                (
                    "        if found_inf:\n            self.scale *= self.backoff_factor",
                    (
                        "        self._library.update(found_inf)\n"
                        "        self.scale = self._library.scale\n"
                        "        return\n"
                        "        if found_inf:\n            self.scale *= self.backoff_factor"
                    ),
                ),
            ],
        ),
        ("grows one step late", [(GROW, "        if self.good_steps > self.growth_interval:")]),
        (
            "an overflow does not restart the count",
            [("            self.good_steps = 0\n            return", "            return")],
        ),
        (
            "keeps growing every step after the first growth",
            [(GROW, "        if self.good_steps >= self.growth_interval:"),
             ("            self.scale *= self.growth_factor\n            self.good_steps = 0",
              "            self.scale *= self.growth_factor")],
        ),
        ("halves on overflow whatever backoff_factor says", [("            self.scale *= self.backoff_factor", "            self.scale *= 0.5")]),
        (
            "accepts a zero scale",
            [("        if not init_scale > 0:", "        if init_scale < 0:")],
        ),
    ],
    "fp16-step": [
        (
            "unscales by the scale after update()",
            [
                (SCALE_READ, ""),
                ("    (loss_fn() * scale).backward()", "    (loss_fn() * scaler.scale).backward()"),
                ("    scaler.update(found_inf)\n", "    scaler.update(found_inf)\n    scale = scaler.scale\n"),
            ],
        ),
        (
            "does not skip an overflowing step",
            [("    if found_inf:\n        return False\n", "")],
        ),
        ("forgets to unscale", [(UNSCALE, "            master.grad = None if p.grad is None else p.grad.float()")]),
        (
            "updates the scaler only after a good step",
            [
                ("    scaler.update(found_inf)\n    if found_inf:\n        return False\n",
                 "    if found_inf:\n        return False\n    scaler.update(found_inf)\n"),
            ],
        ),
        ("never copies the masters into the model", [("            p.copy_(master)", "            pass")]),
        (
            "keeps the previous step's gradients",
            [("    for p in params:\n        p.grad = None\n", "")],
        ),
    ],
    "train-16bit": [
        (
            "uses distlab's MixedPrecisionOptimizer",
            [
                (
                    "    if master_weights:\n        master = weight.float()",
                    (
                        "    holder = nn.Module()\n"
                        "    holder.w = nn.Parameter(weight.clone())\n"
                        "    optimizer = (MixedPrecisionOptimizer(holder, torch.optim.SGD, lr=lr) if master_weights\n"
                        "                 else torch.optim.SGD(holder.parameters(), lr=lr))\n"
                        "    for g in gradients:\n"
                        "        holder.w.grad = g.to(weight.dtype)\n"
                        "        optimizer.step()\n"
                        "    return holder.w.detach()\n"
                        "    if master_weights:\n        master = weight.float()"
                    ),
                )
            ],
        ),
        ("ignores master_weights", [("    if master_weights:\n        master", "    if False:\n        master")]),
        (
            "without masters still accumulates in fp32",
            [("        w = (w.float() - lr * g.float()).to(weight.dtype)\n    return w",
              "        w = w.float() - lr * g.float()\n    return w.to(weight.dtype)")],
        ),
        (
            "rounds the master to 16 bits every step",
            [("            master = master - lr * g.float()",
              "            master = (master - lr * g.float()).to(weight.dtype).float()")],
        ),
        (
            "updates the caller's weight in place",
            [("    w = weight.clone()\n", "    w = weight\n"),
             ("        w = (w.float() - lr * g.float()).to(weight.dtype)",
              "        w.copy_((w.float() - lr * g.float()).to(weight.dtype))")],
        ),
        ("returns the fp32 master", [("        return master.to(weight.dtype)", "        return master")]),
        (
            "accepts an fp32 weight",
            [("    if weight.dtype not in (torch.bfloat16, torch.float16):", "    if weight.dtype == torch.float64:")],
        ),
    ],
}
