#!/usr/bin/env python3
"""Anchor for keel's model benchmarks: LeNet-5 (MNIST shapes) and ResNet-20 (32x32x3) training steps
in PyTorch with the same shapes, optimizers and batch sizes as `keel bench lenet|resnet`.

Prints one JSON line: {"system": "torch ...", "model": ..., "step_ms": median, ...}.
  /usr/bin/python3 torch_models.py --model lenet --batch 64
  /usr/bin/python3 torch_models.py --model resnet --batch 32
"""
import argparse, json, statistics, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 6, 5, padding=2)
        self.c2 = nn.Conv2d(6, 16, 5)
        self.f1, self.f2, self.f3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = torch.flatten(x, 1)
        return self.f3(F.relu(self.f2(F.relu(self.f1(x)))))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(h + (x if self.short is None else self.short(x)))


class ResNet20(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.b = nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16)
        layers, cin = [], 16
        for stage, cout in enumerate((16, 32, 64)):
            for i in range(3):
                layers.append(Block(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.layers(F.relu(self.b(self.c(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

class TinyTransformer(nn.Module):
    """keel's built-in transformer (models/transformer): token and position embeddings, post-norm
    encoder layers (self-attention with q/k/v/out projections, then fc-gelu-fc), each followed by
    layer_norm of the residual sum, and a classifier per position. Defaults: vocab 10, sequence 8,
    d_model 32, 2 heads, d_ff 64, 2 layers."""

    def __init__(self, vocab=10, seq_len=8, d_model=32, heads=2, d_ff=64, layers=2):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        self.qkv = nn.ModuleList(nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(4))
                                 for _ in range(layers))
        self.ff = nn.ModuleList(nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(),
                                              nn.Linear(d_ff, d_model)) for _ in range(layers))
        self.ln = nn.ModuleList(nn.ModuleList(nn.LayerNorm(d_model) for _ in range(2))
                                for _ in range(layers))
        self.out = nn.Linear(d_model, vocab)

    def forward(self, ids):  # ids [N, L] -> logits [N * L, vocab]
        x = self.emb(ids) + self.pos
        n, l, d = x.shape
        e = d // self.heads
        for (q, k, v, o), ff, (ln1, ln2) in zip(self.qkv, self.ff, self.ln):
            split = lambda t: t.view(n, l, self.heads, e).transpose(1, 2)  # noqa: E731
            scores = split(q(x)) @ split(k(x)).transpose(-1, -2) / e ** 0.5
            ctx = (scores.softmax(-1) @ split(v(x))).transpose(1, 2).reshape(n, l, d)
            x = ln1(x + o(ctx))
            x = ln2(x + ff(x))
        return self.out(x).reshape(n * l, -1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["lenet", "resnet"], default="lenet")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.model == "lenet":
        model, shape = LeNet(), (a.batch, 1, 28, 28)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        model, shape = ResNet20(), (a.batch, 3, 32, 32)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.rand(*shape), torch.randint(0, 10, (a.batch,))
    times = []
    for i in range(a.steps + 5):
        t = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i >= 5:
            times.append((time.perf_counter() - t) * 1e3)
    med = statistics.median(times)
    print(json.dumps({"system": "torch " + torch.__version__, "model": a.model, "threads": a.threads,
                      "batch": a.batch, "step_ms": round(med, 3),
                      "samples_per_s": round(a.batch / med * 1e3, 1)}))


if __name__ == "__main__":
    main()

