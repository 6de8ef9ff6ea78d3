#!/usr/bin/env python3
"""PyTorch anchors for tools/gpu_check.sh on the same GPU: the seed MLP at batch 128 (eager and
torch.compile(mode="reduce-overhead")), ResNet-20 at batch 128 and keel's small Transformer at
batch 64 (eager). One JSON line per run
with the median step time (CUDA-synchronised) and torch.cuda.max_memory_allocated.
With the argument `amp`: the same three models eager under torch.autocast, float16 (with a
GradScaler, as keel's fp16 loss scaling) and bfloat16. With `large`: ResNet-20 at batch 1024 and
the MLP 8192 wide at batch 4096, float32 and autocast float16 (compute-bound sizes), and ResNet-20
at batch 1024 once more in channels-last (NHWC) memory format: keel's convolutions are NCHW only,
and these rows say what NHWC, which cuDNN's half-precision Tensor Core kernels want, buys."""
import json, os, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import ResNet20, TinyTransformer  # noqa: E402


def mlp(hidden=1280):
    return nn.Sequential(nn.Linear(32, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, 2))


def bench(name, model, shape, classes, opt, steps=200, compile_mode=None, tokens=False, amp=None,
          channels_last=False):
    dev = torch.device("cuda")
    model = model.to(dev)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    optim = opt(model.parameters())
    if tokens:  # ids [N, L]; a label per position
        x = torch.randint(0, classes, shape, device=dev)
        y = torch.randint(0, classes, (shape[0] * shape[1],), device=dev)
    else:
        x = torch.rand(*shape, device=dev)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (shape[0],), device=dev)

    scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None

    def step():
        optim.zero_grad(set_to_none=True)
        if amp is None:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optim.step()
            return loss
        with torch.autocast("cuda", dtype=amp):
            loss = F.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            optim.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optim)
            scaler.update()
        return loss

    fn = torch.compile(step, mode=compile_mode) if compile_mode else step
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    print(json.dumps({"system": "torch " + torch.__version__, "run": name, "batch": shape[0],
                      "step_ms": round(statistics.median(times), 4),
                      "peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}),
          flush=True)


def main():
    torch.manual_seed(0)
    sgd = lambda lr, m=0.0: (lambda p: torch.optim.SGD(p, lr=lr, momentum=m))  # noqa: E731
    adam = lambda lr: (lambda p: torch.optim.Adam(p, lr=lr))  # noqa: E731
    if sys.argv[1:] == ["large"]:
        for tag, dt in (("f32", None), ("fp16", torch.float16)):
            bench("mlp8192_b4096_" + tag, mlp(8192), (4096, 32), 2, sgd(0.01), steps=30, amp=dt)
            bench("resnet20_b1024_" + tag, ResNet20(), (1024, 3, 32, 32), 10, sgd(0.05, 0.9),
                  steps=30, amp=dt)
        for tag, dt in (("f32", None), ("fp16", torch.float16)):
            bench("resnet20_b1024_nhwc_" + tag, ResNet20(), (1024, 3, 32, 32), 10,
                  sgd(0.05, 0.9), steps=30, amp=dt, channels_last=True)
        return
    if sys.argv[1:] == ["amp"]:
        for tag, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            bench("mlp_eager_" + tag, mlp(), (128, 32), 2, sgd(0.01), amp=dt)
            bench("resnet20_eager_" + tag, ResNet20(), (128, 3, 32, 32), 10, sgd(0.05, 0.9),
                  steps=50, amp=dt)
            bench("transformer_eager_" + tag, TinyTransformer(), (64, 8), 10, adam(0.003),
                  tokens=True, amp=dt)
        return
    bench("mlp_eager", mlp(), (128, 32), 2, sgd(0.01))
    try:
        bench("mlp_compile_reduce_overhead", mlp(), (128, 32), 2, sgd(0.01),
              compile_mode="reduce-overhead")
    except Exception as e:  # a missing compiler toolchain must not hide the other numbers
        print(json.dumps({"run": "mlp_compile_reduce_overhead", "error": str(e)[:200]}))
    bench("resnet20_eager", ResNet20(), (128, 3, 32, 32), 10, sgd(0.05, 0.9), steps=50)
    bench("transformer_eager", TinyTransformer(), (64, 8), 10, adam(0.003), tokens=True)


if __name__ == "__main__":
    main()
