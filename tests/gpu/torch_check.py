#!/usr/bin/env python3
"""PyTorch on a GPU, run the same way natively and under the shim; run.py compares the two runs.

    torch_check.py CHECK [--device cuda|cpu]

Prints `key value` lines (what run.py compares).  Exit 0: every check held; 1: one broke; 77: no CUDA
device for PyTorch (ctest reports the test as skipped).  --device cpu runs what can run without a GPU
(train, dataloader), to try the script itself."""
import argparse
import os
import sys

try:
    import torch
except ImportError:
    print("PyTorch is not importable by", sys.executable)
    sys.exit(77)

MiB = 1 << 20


def put(key, value):
    print(key, value, flush=True)


def fail(msg):
    print("torch_check:", msg, file=sys.stderr, flush=True)
    sys.exit(1)


class GlobalMean(torch.nn.Module):
    def forward(self, x):
        return x.mean((2, 3))


def check_train(dev):
    """A deterministic training run: every step's loss, exactly."""
    torch.manual_seed(0)
    # Kernels without a deterministic version would make the runs differ with or without the shim:
    # warned about, and the model below avoids the usual ones (adaptive pooling's backward).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    nn = torch.nn
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        GlobalMean(), nn.Linear(128, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (256,), generator=g)
    for step in range(30):
        i = (step * 32) % 256
        xb, yb = x[i:i + 32].to(dev), y[i:i + 32].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        # Tensors of changing sizes between steps, so the allocator works.
        junk = [torch.empty(int(s), device=dev) for s in (1e3, 1e5, 3e6, 7e5)]
        del junk
        put(f"loss_{step:02d}", float(loss.item()).hex())


def check_graphs(dev):
    """A model captured in a CUDA graph (its intermediates allocated during the capture) replays as
    eager execution computes."""
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512), nn.LayerNorm(512)).to(dev)
    model.eval()
    static_in = torch.randn(64, 512, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_out = model(static_in)
    worst = 0.0
    for i in range(20):
        x = torch.randn(64, 512, device=dev)
        static_in.copy_(x)
        g.replay()
        with torch.no_grad():
            ref = model(x)
        torch.cuda.synchronize()
        worst = max(worst, (static_out - ref).abs().max().item())
        # Eager allocations between replays must not land in the graph's memory.
        scratch = torch.full((1 << 20,), float(i), device=dev)
        g.replay()
        torch.cuda.synchronize()
        if not torch.equal(scratch, torch.full_like(scratch, float(i))):
            fail("a replay wrote into a tensor allocated after the capture")
        del scratch
    put("replays", 20)
    put("max_abs_diff", worst)
    if worst > 1e-5:
        fail(f"graph replay differs from eager execution by {worst}")


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


def check_dataloader(dev):
    """CUDA is initialised, then a DataLoader forks its workers: they run, and the parent's CUDA keeps
    working."""
    a = torch.arange(1 << 20, device=dev, dtype=torch.float64)
    loader = torch.utils.data.DataLoader(Squares(), batch_size=32, num_workers=2,
                                         multiprocessing_context="fork")
    total = 0.0
    for epoch in range(2):
        for batch in loader:
            total += batch.to(dev, dtype=torch.float64).sum().item()
    want = 2 * sum(float(i * i) for i in range(512))
    put("batches_sum", total)
    if total != want:
        fail(f"the workers' batches summed to {total}, not {want}")
    s = a.sum().item()
    put("device_sum", s)
    if s != float((1 << 20) * ((1 << 20) - 1) // 2):
        fail("the parent's tensor changed across the workers' fork")


def largest_tensor(dev, hi):
    """The largest uint8 tensor that can be allocated, to 1 MiB."""
    lo = 0
    hi = hi // MiB + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            torch.empty(mid * MiB, dtype=torch.uint8, device=dev)  # freed at once
            lo = mid
        except torch.cuda.OutOfMemoryError:
            hi = mid
        torch.cuda.empty_cache()
    return lo * MiB


def check_frag(dev):
    """PyTorch fills the card with 1 MiB tensors, keeps one in 64, frees the rest and empties its cache:
    the largest tensor that then fits, and what torch.cuda.mem_get_info says."""
    held = []
    try:
        while True:
            held.append(torch.empty(MiB, dtype=torch.uint8, device=dev))
    except torch.cuda.OutOfMemoryError:
        pass
    n = len(held)
    keep = held[::64]
    del held
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    big = largest_tensor(dev, free + 64 * MiB)
    put("tensors", n)
    put("kept", len(keep))
    put("free_bytes", free)
    put("total_bytes", total)
    put("largest_bytes", big)
    if big > free:
        fail(f"a tensor of {big} bytes fit but mem_get_info said {free} free")
    del keep
    torch.cuda.empty_cache()
    put("largest_bytes_all_freed", largest_tensor(dev, total))


CHECKS = {"train": check_train, "graphs": check_graphs, "dataloader": check_dataloader, "frag": check_frag}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("check", choices=sorted(CHECKS))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device for PyTorch (torch.cuda.is_available() is False)")
        return 77
    if a.device == "cpu" and a.check not in ("train", "dataloader"):
        print(f"{a.check} needs a CUDA device")
        return 77
    if a.device == "cuda":
        put("device", torch.cuda.get_device_name().replace(" ", "_"))
    put("torch", torch.__version__)
    CHECKS[a.check](torch.device(a.device))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    sys.exit(main())
