"""A small GPT (pre-norm blocks, causal attention, untied LM head) for the
FLOP tests and the FlopCounterMode cost bench: the fixture's GPT shape
(``tests/fixtures/h200/steps.json``) scaled down to run on a CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int, sdpa: bool) -> None:
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # hand-written: q@kᵀ, mask, softmax, @v
            att = (q @ k.transpose(-2, -1)) / (k.size(-1) ** 0.5)
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(
        self,
        layers: int = 2,
        d: int = 64,
        heads: int = 4,
        vocab: int = 128,
        seq: int = 32,
        sdpa: bool = False,
    ) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, sdpa) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: int, seq: int, vocab: int):
    """One next-token training step on random tokens."""
    idx = torch.randint(0, vocab, (batch, seq))
    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, vocab), idx.roll(-1, 1).view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
