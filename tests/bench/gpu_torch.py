#!/usr/bin/env python3
"""PyTorch workloads on a GPU for tests/bench/gpu.py; one JSON object on the last stdout line.

    gpu_torch.py train   [--steps N] [--device cuda|cpu]   ResNet-50 (torchvision, else a smaller ResNet), bf16
    gpu_torch.py webui   [--requests N]                    inference at several resolutions, gc + empty_cache each
    gpu_torch.py offload [--prompts N] [--gap S]           a large fp16 module to the CPU and back per prompt,
                                                           the host still S seconds between prompts (generation)

--device cpu runs a tiny version of each on the CPU, to try the script without a GPU."""
import argparse
import gc
import json
import statistics
import time

import torch
import torch.nn as nn


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def reserved(dev):
    return torch.cuda.max_memory_reserved() if dev.type == "cuda" else 0


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def small_resnet(classes=1000):
    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def train(a, dev):
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    try:
        import torchvision
        model, name = torchvision.models.resnet50(), "resnet50"
    except ImportError:
        model, name = small_resnet(), "resnet18-like"
    model = model.to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    bs, res = (32, 224) if dev.type == "cuda" else (2, 64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(bs, 3, res, res, generator=g).to(dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (bs,), generator=g).to(dev)
    times, loss = [], None
    for step in range(a.steps):
        sync(dev)
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync(dev)
        if step >= 3:  # warm-up steps are not timed
            times.append((time.perf_counter() - t0) * 1e3)
    return {"model": name, "ms_per_step": statistics.median(times), "loss_last": float(loss.item()),
            "peak_reserved_bytes": reserved(dev)}


def unet_like(ch):
    def conv(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, 1, 1), nn.GroupNorm(8, o), nn.SiLU())
    return nn.Sequential(
        conv(4, ch), conv(ch, ch), nn.Conv2d(ch, 2 * ch, 3, 2, 1), conv(2 * ch, 2 * ch), conv(2 * ch, 2 * ch),
        nn.Conv2d(2 * ch, 4 * ch, 3, 2, 1), conv(4 * ch, 4 * ch), conv(4 * ch, 4 * ch),
        nn.Upsample(scale_factor=2), conv(4 * ch, 2 * ch), nn.Upsample(scale_factor=2), conv(2 * ch, ch),
        nn.Conv2d(ch, 4, 3, 1, 1))


def webui(a, dev):
    """Requests at changing resolutions (latents of 512-1024 px images), each a few denoising steps,
    then what WebUIs do after a request: gc.collect() and torch.cuda.empty_cache()."""
    cuda = dev.type == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    model = unet_like(320 if cuda else 16).to(dev, dtype).eval()
    sizes = (512, 768, 640, 1024, 832) if cuda else (64, 96)
    times, clears = [], []
    for r in range(a.requests):
        px = sizes[r % len(sizes)]
        sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            x = torch.randn(1, 4, px // 8, px // 8, device=dev, dtype=dtype)
            for _ in range(4 if cuda else 1):
                x = x - 0.1 * model(x)
            img = x.float().cpu()
        del x, img
        t1 = time.perf_counter()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        t2 = time.perf_counter()
        times.append((t2 - t0) * 1e3)
        clears.append((t2 - t1) * 1e3)
    return {"ms_per_request": statistics.median(times), "ms_gc_empty_cache": statistics.median(clears),
            "peak_reserved_bytes": reserved(dev)}


def offload(a, dev):
    """The prompt-change offload: a large fp16 text encoder moved to the CPU, the cache emptied, moved
    back to the GPU, per prompt; then the host sits still for --gap seconds, as it does while the GPU
    generates.  ms_per_change is the median over the prompts after the first (the first faults in
    memory under every allocator)."""
    cuda = dev.type == "cuda"
    width, depth = (4096, 40) if cuda else (256, 4)  # 40 x 4096^2 fp16 = 1.3 GB
    enc = nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(depth)]).half().to(dev)
    times, clears = [], []
    for _ in range(a.prompts):
        sync(dev)
        t0 = time.perf_counter()
        enc.to("cpu")
        t1 = time.perf_counter()
        if cuda:
            torch.cuda.empty_cache()
        t2 = time.perf_counter()
        enc.to(dev)
        sync(dev)
        t3 = time.perf_counter()
        times.append((t3 - t0) * 1e3)
        clears.append((t2 - t1) * 1e3)
        time.sleep(a.gap)
    later = times[1:] or times
    return {"ms_per_change": statistics.median(later), "ms_first_change": times[0],
            "ms_changes": [round(t, 1) for t in times], "ms_empty_cache": statistics.median(clears),
            "module_bytes": sum(p.numel() * p.element_size() for p in enc.parameters())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", choices=["train", "webui", "offload"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--gap", type=float, default=0.0, help="offload: seconds the host sits still per prompt")
    a = ap.parse_args()
    dev = torch.device(a.device)
    out = {"train": train, "webui": webui, "offload": offload}[a.workload](a, dev)
    out["torch"] = torch.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
