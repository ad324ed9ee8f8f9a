"""Synchronised batch normalisation: batch statistics over all ranks, not one.

BatchNorm normalises each channel with the mean and variance of the current
batch (Ioffe & Szegedy 2015, Algorithm 1). Under data parallelism each rank sees only its
local batch: with 2 samples per rank the "batch statistics" are those of 2
samples, noisy and different on every rank, so the model trains as if the
batch were tiny, and the replicas' running statistics drift apart.

SyncBatchNorm all-reduces, per channel, the count, the sum and the sum of
squares of the inputs, so every rank normalises with the statistics of the
global batch; the result is exactly single-process BatchNorm on the whole
batch. Backward needs two more global sums per channel, of ``dy`` and of
``dy * x_hat``:

    dx = w / sigma * (dy - mean(dy) - x_hat * mean(dy * x_hat))

where the means run over the global batch. The statistics are summed in
float64, so the single-pass formula var = E[x^2] - E[x]^2 loses nothing that
matters in fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from distlab.collectives.buffers import Group
from distlab.core.checks import positive_int
from distlab.parallel.comm.collectives import Collectives


def _channel_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over every dimension but the channel dimension (1)."""
    dims = [d for d in range(x.dim()) if d != 1]
    return x.sum(dim=dims)


def _as_channels(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(1, -1, *([1] * (like.dim() - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, comm: Collectives, eps: float):
        x64 = x.double()
        count = torch.tensor([x.numel() / x.shape[1]], dtype=torch.float64, device=x.device)
        stats = torch.cat([count, _channel_sum(x64), _channel_sum(x64 * x64)])
        comm.all_reduce_sum_(stats)
        c = x.shape[1]
        n, total, total_sq = stats[0], stats[1 : 1 + c], stats[1 + c :]
        mean = total / n
        var = (total_sq / n - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        x_hat = ((x64 - _as_channels(mean, x)) * _as_channels(invstd, x)).to(x.dtype)
        ctx.save_for_backward(x_hat, weight, invstd.to(x.dtype))
        ctx.comm, ctx.n = comm, n
        y = x_hat * _as_channels(weight, x) + _as_channels(bias, x)
        return y, mean.to(x.dtype), var.to(x.dtype), n

    @staticmethod
    def backward(ctx, dy, _dmean, _dvar, _dn):
        x_hat, weight, invstd = ctx.saved_tensors
        local = torch.cat([_channel_sum(dy), _channel_sum(dy * x_hat)]).double()
        sums = local.clone()
        ctx.comm.all_reduce_sum_(sums)
        c = x_hat.shape[1]
        mean_dy = (sums[:c] / ctx.n).to(dy.dtype)
        mean_dy_xhat = (sums[c:] / ctx.n).to(dy.dtype)
        dx = _as_channels(weight * invstd, dy) * (
            dy - _as_channels(mean_dy, dy) - x_hat * _as_channels(mean_dy_xhat, dy)
        )
        # Weight and bias gradients stay local: data parallelism averages them.
        dweight = local[c:].to(dy.dtype)
        dbias = local[:c].to(dy.dtype)
        return dx, dweight, dbias, None, None


class SyncBatchNorm(nn.Module):
    """BatchNorm over (N, C, ...) inputs with statistics of the batch on all ranks.

    Same parameters and buffers as ``nn.BatchNorm1d/2d`` (so their state
    dicts load into each other). In eval mode it uses the running statistics
    and does not communicate.
    """

    def __init__(
        self,
        num_features: int,
        *,
        eps: float = 1e-5,
        momentum: float = 0.1,
        algorithm: str = "ring",
        group: Group = None,
    ):
        super().__init__()
        num_features = positive_int("num_features", num_features)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.comm = Collectives(algorithm, group)
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2 or x.shape[1] != self.num_features:
            raise ValueError(
                f"expected input (N, {self.num_features}, ...), got shape {tuple(x.shape)}"
            )
        if not self.training:
            return nn.functional.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        y, mean, var, n = _SyncBatchNormFunction.apply(
            x, self.weight, self.bias, self.comm, self.eps
        )
        with torch.no_grad():  # running statistics use the unbiased variance, like nn.BatchNorm
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(mean, alpha=m)
            self.running_var.mul_(1 - m).add_(var * (n / (n - 1)).to(var.dtype), alpha=m)
            self.num_batches_tracked += 1
        return y

    @classmethod
    def convert(
        cls, module: nn.Module, *, algorithm: str = "ring", group: Group = None
    ) -> nn.Module:
        """Replace every BatchNorm1d/2d/3d in ``module`` by a SyncBatchNorm with its state."""
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            sync = cls(
                module.num_features,
                eps=module.eps,
                momentum=module.momentum,
                algorithm=algorithm,
                group=group,
            )
            sync.load_state_dict(module.state_dict())
            return sync
        for name, child in module.named_children():
            setattr(module, name, cls.convert(child, algorithm=algorithm, group=group))
        return module
