"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks.

A MoE layer replaces one MLP by ``E`` expert MLPs and a router (Shazeer et
al. 2017; GShard, Lepikhin et al. 2020, Section 2.1; Switch Transformer, Fedus et al. 2021,
Section 2.1):

1. **route**: ``p = softmax(x W_r)`` per token; the token goes to its top-k
   experts with gate ``p_i`` (k = 1, Switch) or ``p_i / sum of its top-k p``
   (k = 2, GShard Algorithm 1);
2. **capacity**: every expert takes at most ``C`` = :func:`expert_capacity`
   tokens from one rank's batch. Slots are handed out first to every token's
   first choice in token order, then to second choices (GShard); an
   assignment past slot ``C`` is **dropped**: it adds nothing to the output
   (the residual connection around the layer carries that token);
3. **dispatch**: tokens are copied into a fixed ``(E, C, hidden)`` buffer;
4. **experts** run on their slots; **combine**: each token sums its experts'
   outputs times the gates.

With expert parallelism the ``ep`` ranks of a group each hold ``E / ep``
experts. The buffer's block ``j`` (the slots of rank ``j``'s experts) is sent
to rank ``j`` by an **all-to-all** (dispatch), the experts run on the tokens
of every rank, and a second all-to-all sends the results back (combine). The
backward pass runs the same two all-to-alls on the gradients, so one layer
costs 4 all-to-alls per step (:func:`distlab.calc.moe.moe_all_to_all_comm`).

The load-balancing loss (Switch Transformer eq. 4) is
``E * sum_i f_i * P_i`` with ``f_i`` the fraction of tokens whose first choice
is expert i and ``P_i`` the mean router probability of expert i; it is 1 when
the load is uniform and larger when it is not. Scale it (Switch: 0.01) and add
it to the loss; each layer leaves it in ``layer.aux_loss`` after a forward.

``MoE`` is the single-process layer; ``ExpertParallelMoE.from_dense`` splits one
across the ranks of a group, so the two can be compared exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from distlab.calc.moe import expert_capacity
from distlab.collectives import all_to_all
from distlab.collectives.buffers import Group
from distlab.core.checks import positive_int
from distlab.parallel.comm.collectives import Collectives
from distlab.parallel.comm.trace import traced

#: ``"pairwise"``: distlab's all-to-all (send/recv); ``"builtin"``: ``dist.all_to_all_single``.
ALL_TO_ALL_ALGORITHMS = ("pairwise", "builtin")


@dataclass
class Routing:
    """Where one batch's tokens go. ``dispatch``/``combine``: ``(tokens, E, C)``."""

    dispatch: torch.Tensor  # 1 where token t sits in slot c of expert e
    combine: torch.Tensor  # the gate of that assignment (differentiable), else 0
    probs: torch.Tensor  # (tokens, E) router probabilities
    first_choice: torch.Tensor  # (tokens,) each token's top-1 expert
    routed: torch.Tensor  # (E,) assignments per expert before dropping
    kept: torch.Tensor  # (E,) assignments per expert after dropping
    capacity: int

    @property
    def dropped(self) -> int:
        """Assignments (token, expert) past the capacity; tokens for k = 1."""
        return int((self.routed - self.kept).sum())

    def load_balancing_loss(self) -> torch.Tensor:
        """Switch Transformer eq. 4: ``E * sum_i f_i P_i`` (1.0 when perfectly balanced)."""
        n_experts = self.probs.shape[1]
        f = torch.bincount(self.first_choice, minlength=n_experts).to(self.probs.dtype)
        f = f / self.first_choice.numel()
        return n_experts * torch.sum(f * self.probs.mean(dim=0))


def route(logits: torch.Tensor, *, top_k: int, capacity: int) -> Routing:
    """Top-k routing with capacity ``capacity`` per expert (see the module docstring).

    ``logits``: ``(tokens, experts)``; ``top_k`` in 1..experts; ``capacity`` >= 1 slots
    per expert (:func:`~distlab.calc.moe.expert_capacity`). Anything else is refused with
    a ``ValueError`` naming it: a capacity of 0 would drop every token."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a (tokens, experts) tensor, got {type(logits).__name__}")
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (tokens, experts), got {tuple(logits.shape)}")
    n_tokens, n_experts = logits.shape
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be an integer in 1..{n_experts} (the experts), got {top_k!r}")
    capacity = positive_int("capacity", capacity)  # 0 slots would drop every token
    probs = torch.softmax(logits.float(), dim=-1)
    gates, experts = probs.topk(top_k, dim=-1)
    if top_k > 1:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    # assignments in priority order: all first choices, then all second choices
    token = torch.arange(n_tokens).repeat(top_k)
    expert = experts.t().reshape(-1)
    gate = gates.t().reshape(-1)
    onehot = F.one_hot(expert, n_experts)
    slot = (onehot.cumsum(dim=0) - 1).gather(1, expert[:, None]).squeeze(1)
    keep = slot < capacity
    index = (token[keep], expert[keep], slot[keep])
    dispatch = torch.zeros(n_tokens, n_experts, capacity).index_put(index, torch.tensor(1.0))
    combine = torch.zeros(n_tokens, n_experts, capacity).index_put(index, gate[keep])
    return Routing(
        dispatch=dispatch,
        combine=combine,
        probs=probs,
        first_choice=experts[:, 0],
        routed=torch.bincount(expert, minlength=n_experts),
        kept=torch.bincount(expert[keep], minlength=n_experts),
        capacity=capacity,
    )


class Expert(nn.Module):
    """One expert: the transformer MLP ``Linear -> GELU -> Linear``."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Router(nn.Linear):
    """The router: a linear layer without bias whose scores are computed in fp32 whatever
    the rest runs in, Switch Transformer's "selective precision" (Fedus et al. 2021,
    Section 2.4.1). A 16-bit router flips top-k choices on rounding alone, and a flipped
    choice moves a token to another expert, a large change; under ``torch.autocast`` the
    experts still run in 16 bits. The layer is called as a module (not read through its
    weight) so that whatever wraps modules sees its forward: FSDP gathers a unit's
    parameters in a hook before the unit's forward (:mod:`distlab.parallel.zero.fsdp`)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast(tokens.device.type, enabled=False):
            return F.linear(tokens.float(), self.weight.float())


class MoE(nn.Module):
    """Single-process MoE layer: a router and ``num_experts`` :class:`Expert` s.

    ``forward(x)`` takes ``(..., hidden)`` and returns the same shape (no
    residual). After it, ``self.aux_loss`` holds the load-balancing loss and
    ``self.routing`` the :class:`Routing` (loads, drops, capacity).
    """

    def __init__(
        self,
        hidden: int,
        ffn_hidden: int,
        num_experts: int,
        *,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if top_k not in (1, 2):
            raise ValueError(f"top_k must be 1 or 2, got {top_k!r}")
        if not isinstance(num_experts, int) or num_experts < top_k:
            raise ValueError(
                f"num_experts must be an integer >= top_k={top_k}, got {num_experts!r}"
            )
        self.num_experts, self.top_k, self.capacity_factor = num_experts, top_k, capacity_factor
        expert_capacity(1, num_experts, top_k=top_k, capacity_factor=capacity_factor)  # checks
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.router = Router(hidden, num_experts, bias=False)
            self.experts = nn.ModuleList(Expert(hidden, ffn_hidden) for _ in range(num_experts))
        self.aux_loss: torch.Tensor | None = None
        self.routing: Routing | None = None

    def _route(self, tokens: torch.Tensor) -> Routing:
        capacity = expert_capacity(
            tokens.shape[0],
            self.num_experts,
            top_k=self.top_k,
            capacity_factor=self.capacity_factor,
        )
        routing = route(self.router_logits(tokens), top_k=self.top_k, capacity=capacity)
        self.routing, self.aux_loss = routing, routing.load_balancing_loss()
        return routing

    def router_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """The router's scores (:class:`Router`, in fp32)."""
        return self.router(tokens)

    def run_experts(self, slots: torch.Tensor) -> torch.Tensor:
        """``(E, C, hidden)`` -> ``(E, C, hidden)``: expert e on its own slots."""
        return torch.stack([expert(slots[e]) for e, expert in enumerate(self.experts)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        routing = self._route(tokens)
        slots = torch.einsum("tec,td->ecd", routing.dispatch.to(x.dtype), tokens)
        out = self.run_experts(slots)
        return torch.einsum("tec,ecd->td", routing.combine.to(x.dtype), out).reshape(x.shape)


class ExpertParallelMoE(MoE):
    """A :class:`MoE` whose experts are spread over the ranks of ``group``.

    Rank ``r`` of the group holds experts ``r * E/ep ... (r+1) * E/ep - 1``;
    the router is replicated (its gradient, like every replicated
    parameter's, is averaged by data parallelism, not here). Every rank of
    the group must pass the same number of tokens (the all-to-all blocks are
    ``E/ep x C x hidden``). ``algorithm``: one of :data:`ALL_TO_ALL_ALGORITHMS`.
    """

    @classmethod
    def from_dense(
        cls, dense: MoE, group: Group = None, *, algorithm: str = "pairwise"
    ) -> ExpertParallelMoE:
        """This rank's share of ``dense``: a copy of its router and of its experts."""
        if algorithm not in ALL_TO_ALL_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALL_TO_ALL_ALGORITHMS}, got {algorithm!r}")
        if not dist.is_initialized():
            raise RuntimeError("no process group: build ExpertParallelMoE inside distlab.run(...)")
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        if dense.num_experts % ep:
            raise ValueError(
                f"num_experts={dense.num_experts} is not divisible by ep={ep} "
                f"(the size of the expert-parallel group); choose ep dividing num_experts"
            )
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.num_experts, layer.top_k = dense.num_experts, dense.top_k
        layer.capacity_factor = dense.capacity_factor
        layer.group, layer.algorithm = group, algorithm
        layer.ep, layer.ep_rank, layer.local_experts = ep, rank, dense.num_experts // ep
        first = rank * layer.local_experts
        layer.router = copy.deepcopy(dense.router)
        layer.experts = nn.ModuleList(
            copy.deepcopy(dense.experts[e]) for e in range(first, first + layer.local_experts)
        )
        layer.aux_loss, layer.routing = None, None
        return layer

    def run_experts(self, slots: torch.Tensor) -> torch.Tensor:
        """Dispatch all-to-all, the local experts on every rank's slots, combine all-to-all."""
        n_experts, capacity, hidden = slots.shape
        blocks = slots.reshape(self.ep, self.local_experts, capacity, hidden)
        received = AllToAll.apply(blocks, self.group, self.algorithm)  # block s: from rank s
        outs = [
            expert(received[:, e].reshape(-1, hidden)).reshape(self.ep, capacity, hidden)
            for e, expert in enumerate(self.experts)
        ]
        returned = AllToAll.apply(torch.stack(outs, dim=1), self.group, self.algorithm)
        return returned.reshape(n_experts, capacity, hidden)


def exchange_blocks(x: torch.Tensor, group: Group, algorithm: str) -> torch.Tensor:
    """All-to-all along dim 0: block ``j`` goes to rank ``j``; block ``s`` of the result came
    from rank ``s``."""
    x = x.contiguous()
    if dist.get_world_size(group) == 1:
        return x.clone()
    out = torch.empty_like(x)
    with traced("all_to_all", group, x, name="ep"):
        if algorithm == "builtin":
            dist.all_to_all_single(out, x, group=group)
        else:
            all_to_all(list(out.unbind(0)), list(x.unbind(0)), group)
    return out


class AllToAll(torch.autograd.Function):
    """All-to-all forward, all-to-all of the gradient backward.

    The exchange is a transpose of the (rank x block) matrix, so its adjoint
    is the same exchange: the gradient of the block rank ``r`` received from
    rank ``s`` goes back to rank ``s`` (GShard, Section 2.2).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group, algorithm: str) -> torch.Tensor:
        ctx.group, ctx.algorithm = group, algorithm
        return exchange_blocks(x, group, algorithm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return exchange_blocks(grad, ctx.group, ctx.algorithm), None, None


def expert_load(routing: Routing) -> torch.Tensor:
    """Fraction of the batch's assignments routed to each expert (before dropping)."""
    return routing.routed.float() / routing.routed.sum()


def average_moe_gradients(model: nn.Module, mesh, *, algorithm: str = "ring") -> None:
    """Average gradients for data parallelism around expert-parallel layers (in place).

    Every rank's loss is the mean over its own batch, and the job's loss the
    mean over the ``dp * cp`` ranks. A replicated parameter's gradient is the
    mean over the ``"dp-cp"`` group. An expert's gradient already sums the
    contributions of the tokens of every rank in its ``"ep"`` group (they
    came back through the all-to-all), so it is **summed** over the
    ``"expert_dp"`` group and divided by ``dp * cp`` (not by the expert-dp size).

    Each group's gradients travel as **one** flat buffer (one per dtype), all-reduced
    once: a collective per tensor would pay its latency once per tensor, which is why
    DDP buckets them (Li et al. 2020, Section 3.2.2; :mod:`distlab.parallel.comm.buckets`).
    Here every gradient exists already, so one bucket per group is enough. The buffer is a
    copy: one more gradient-sized tensor while the sum travels, freed when it is copied
    back (DDP copies into its buckets too, unless ``gradient_as_bucket_view=True`` makes
    the gradients views of them).
    ``mesh``: a :class:`distlab.parallel.compose.mesh.ParallelMesh`; ``algorithm`` as in
    :class:`distlab.parallel.comm.collectives.Collectives`.
    """
    expert_params = {
        id(p)
        for module in model.modules()
        if isinstance(module, ExpertParallelMoE)
        for p in module.experts.parameters()
    }
    dense, experts = [], []
    for p in model.parameters():
        if p.grad is not None:
            (experts if id(p) in expert_params else dense).append(p.grad)
    data_parallel = mesh.size("dp-cp")
    for group_grads, group in ((dense, mesh["dp-cp"]), (experts, mesh["expert_dp"])):
        summed = Collectives(algorithm, group=group)
        if summed.world_size == 1:  # nothing to sum (no dp, or ep = dp * cp): no copy either
            if data_parallel > 1:
                for grad in group_grads:
                    grad.div_(data_parallel)
            continue
        for dtype in dict.fromkeys(g.dtype for g in group_grads):  # in first-seen order
            same = [g for g in group_grads if g.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in same])
            summed.all_reduce_sum_(flat)
            flat.div_(data_parallel)
            for grad, part in zip(same, flat.split([g.numel() for g in same]), strict=True):
                grad.copy_(part.view_as(grad))


def load_balance_run(
    *,
    aux_weight: float,
    steps: int = 60,
    tokens: int = 64,
    hidden: int = 16,
    num_experts: int = 4,
    top_k: int = 1,
    capacity_factor: float = 2.0,
    lr: float = 0.02,
    seed: int = 0,
) -> torch.Tensor:
    """Train a single-process :class:`MoE` on a regression task; return each step's load.

    The model is ``x -> x + MoE(x)`` fit to a random teacher by Adam on the
    loss ``mse + aux_weight * aux_loss``. The inputs share a common offset, so
    the router starts out favouring some experts; without the balancing loss
    those experts learn fastest and keep attracting tokens. Returns a
    ``(steps, num_experts)`` tensor: the fraction of assignments routed to
    each expert at each step (:func:`expert_load`).
    """
    if not isinstance(aux_weight, (int, float)) or aux_weight < 0:
        raise ValueError(f"aux_weight must be a number >= 0, got {aux_weight!r}")
    generator = torch.Generator().manual_seed(seed)
    layer = MoE(hidden, 2 * hidden, num_experts, top_k=top_k,
                capacity_factor=capacity_factor, seed=seed)  # fmt: skip
    teacher = torch.randn(hidden, hidden, generator=generator) / hidden**0.5
    offset = torch.randn(hidden, generator=generator)
    optimizer = torch.optim.Adam(layer.parameters(), lr=lr)
    loads = []
    for _ in range(steps):
        x = torch.randn(tokens, hidden, generator=generator) + offset
        target = torch.tanh(x @ teacher)
        loss = F.mse_loss(x + layer(x), target) + aux_weight * layer.aux_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loads.append(expert_load(layer.routing))
    return torch.stack(loads)
