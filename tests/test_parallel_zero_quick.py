"""ZeRO-1 and ZeRO-2 on two real processes, quickly: the fast tier's multi-process check of
the ZeRO family (tests/test_parallel_methods.py checks every method on 1-4 ranks, slowly).

With fp32 Adam on an MLP and one micro-batch, ZeRO's reduce-scatter, sharded step and
all-gather do the same arithmetic per element as naive DDP's all-reduce and full step, so
the parameters must be bitwise equal after three steps; each rank keeps only its half of
Adam's state (up to the padding of the flat buffers).
"""

import torch

import distlab

GLOBAL_BATCH, STEPS, BUCKET_MB = 24, 3, 0.004


def _train(rank, world_size):
    import torch

    torch.set_num_threads(1)
    from distlab.models import MLP, mlp_batch
    from distlab.parallel import measure_model_state
    from distlab.parallel.checkpoint.data_parallel import full_state
    from distlab.parallel.data import training as T

    out = {}
    for method in ("naive_ddp", "zero1", "zero2"):
        options = {} if method == "naive_ddp" else {"bucket_cap_mb": BUCKET_MB}
        trainer = T.build(method, MLP(seed=1), lr=1e-2, **options)
        for step in range(STEPS):
            T.train_step(trainer, mlp_batch(GLOBAL_BATCH, seed=step), T.mse_loss)
        state = measure_model_state(trainer.model, trainer.optimizer)
        out[method] = (full_state(trainer.model, trainer.optimizer)["params"], state)
    return out


def test_zero1_and_zero2_equal_ddp_bit_for_bit_with_sharded_optimizer_state():
    for rank_out in distlab.run(_train, 2, timeout=300):
        reference, ddp_state = rank_out["naive_ddp"]
        for method in ("zero1", "zero2"):
            params, state = rank_out[method]
            for key, value in reference.items():
                assert torch.equal(params[key], value), (method, key)
            assert 2 * state.optimizer_states <= ddp_state.optimizer_states + 64, (method, state)
