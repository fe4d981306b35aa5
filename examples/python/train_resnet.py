#!/usr/bin/env python3
"""Train ResNet-18 (random init, random data, fixed seed) for a few steps on the GPU.

Run once with PyTorch's own allocator and once (in another process) with
libgpumem as PyTorch's allocator; with deterministic settings the losses
must match:

    python3 examples/python/train_resnet.py --allocator torch  --out torch.json
    python3 examples/python/train_resnet.py --allocator gpumem --out gpumem.json
    python3 examples/python/train_resnet.py --compare torch.json gpumem.json

Prints the loss of every step, the time per step, and the memory peaks
(torch.cuda.max_memory_reserved with PyTorch's allocator; libgpumem's
reserved_peak/allocated_peak with gpumem).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# cuBLAS needs this before CUDA starts for deterministic GEMMs.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _resnet18(torch, num_classes: int):
    """torchvision's resnet18 when installed, otherwise the same architecture written here."""
    try:
        import torchvision

        return torchvision.models.resnet18(weights=None, num_classes=num_classes), "torchvision"
    except ImportError:
        pass
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.down is None else self.down(x)
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(y)) + idt)

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model, "builtin"


def train(args) -> dict:
    ctx = None
    if args.allocator == "gpumem":
        import gpumem.torch  # before any CUDA tensor exists

        gpumem.torch.enable(device=0)
        ctx = gpumem.torch.context()
    import torch

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)

    model, arch = _resnet18(torch, args.classes)  # initialised on the CPU: same weights in every process
    gen = torch.Generator().manual_seed(args.seed + 1)
    images = torch.randn(args.steps, args.batch, 3, args.image_size, args.image_size, generator=gen)
    labels = torch.randint(0, args.classes, (args.steps, args.batch), generator=gen)

    dev = torch.device("cuda", 0)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses, times = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = images[step].to(dev)
        y = labels[step].to(dev)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()  # synchronises
        times.append(time.perf_counter() - t0)
        losses.append(value)
        print("step %3d loss %.9f (%s) %.1f ms" % (step, value, float.hex(value), times[-1] * 1e3), flush=True)
    torch.cuda.synchronize()
    free_b, total_b = torch.cuda.mem_get_info(0)
    result = {
        "allocator": args.allocator,
        "model": arch,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "steps": args.steps,
        "batch": args.batch,
        "image_size": args.image_size,
        "losses": losses,
        "losses_hex": [float.hex(v) for v in losses],
        "median_step_ms_after_warmup": sorted(times[3:])[len(times[3:]) // 2] * 1e3 if len(times) > 3 else None,
        "mem_get_info_free": free_b,
        "mem_get_info_total": total_b,
    }
    if ctx is None:
        result["torch_max_memory_reserved"] = torch.cuda.max_memory_reserved(0)
        result["torch_max_memory_allocated"] = torch.cuda.max_memory_allocated(0)
    else:
        st = ctx.stats(0)
        result["gpumem_stats"] = st
        result["gpumem_reserved_peak"] = st["reserved_peak"]
        result["gpumem_allocated_peak"] = st["allocated_peak"]
    return result


def compare(paths) -> int:
    runs = [json.load(open(p)) for p in paths]
    base = runs[0]
    status = 0
    for other in runs[1:]:
        a, b = base["losses"], other["losses"]
        if len(a) != len(b):
            print("different number of steps: %d vs %d" % (len(a), len(b)))
            status = 1
            continue
        exact = sum(x == y for x, y in zip(a, b))
        max_abs = max(abs(x - y) for x, y in zip(a, b))
        max_rel = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
        ok = max_rel <= 1e-6
        print("%s vs %s: %d/%d steps bitwise equal, max |diff| %.3g, max rel diff %.3g -> %s"
              % (base["allocator"], other["allocator"], exact, len(a), max_abs, max_rel, "MATCH" if ok else "MISMATCH"))
        status |= 0 if ok else 1
    for r in runs:
        if "torch_max_memory_reserved" in r:
            print("%-7s torch max_memory_reserved %.1f MiB, max_memory_allocated %.1f MiB, median step %.2f ms"
                  % (r["allocator"], r["torch_max_memory_reserved"] / 2**20, r["torch_max_memory_allocated"] / 2**20,
                     r["median_step_ms_after_warmup"] or 0))
        if "gpumem_reserved_peak" in r:
            print("%-7s gpumem reserved_peak %.1f MiB, allocated_peak %.1f MiB, median step %.2f ms"
                  % (r["allocator"], r["gpumem_reserved_peak"] / 2**20, r["gpumem_allocated_peak"] / 2**20,
                     r["median_step_ms_after_warmup"] or 0))
    return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocator", choices=("torch", "gpumem"), default="torch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--compare", nargs="+", metavar="JSON", help="compare result files (first is the reference)")
    args = p.parse_args()
    if args.compare:
        return compare(args.compare)
    result = train(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
