#!/usr/bin/env python3
"""Train a model for a few steps with PyTorch's allocator and with libgpumem, side by side.

Each run is its own process (the allocator is chosen before CUDA starts); with
deterministic settings the losses of every run must be the same:

    python3 examples/python/torch_train.py --model resnet50 --allocator torch      --out a.json
    python3 examples/python/torch_train.py --model resnet50 --allocator expandable --out b.json
    python3 examples/python/torch_train.py --model resnet50 --allocator gpumem     --out c.json
    python3 examples/python/torch_train.py --compare a.json b.json c.json

or all of it at once (the three allocators, and PyTorch's allocator a second
time as the determinism control), for each model named:

    python3 examples/python/torch_train.py --all resnet50 transformer

Allocators: ``torch`` (PyTorch's caching allocator as installed), ``expandable``
(the same with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) and
``gpumem`` (``gpumem.torch.enable()``). Models: ``resnet18``/``resnet50``
(torchvision's when installed, else the same architecture written here) on
random images, ``transformer`` (a GPT-style decoder, 12 layers, d=768,
sequence 512) on random tokens, trained in bf16 autocast with AdamW, and
``transformer_dyn``, the same decoder with dynamic shapes: every step draws its
batch (from half to twice ``--batch``) and its sequence length (from a quarter
of ``--seq`` to all of it) from the seeded generator, as training on batches of
variable-length text does, so that every tensor of the step changes size.

Printed per run: the loss of every step, the median step time after 3 warm-up
steps, and the peaks of ``torch.cuda.max_memory_allocated`` and
``torch.cuda.max_memory_reserved`` (with gpumem these are libgpumem's figures,
through the shim).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# cuBLAS needs this before CUDA starts for deterministic GEMMs.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

HERE = os.path.dirname(os.path.abspath(__file__))
BINDINGS = os.path.abspath(os.path.join(HERE, os.pardir, os.pardir, "bindings", "python"))
ALLOCATORS = ("torch", "expandable", "gpumem", "gpumem-plain")
MODELS = ("resnet18", "resnet50", "transformer", "transformer_dyn")
MiB = 1 << 20


def _resnet(torch, depth: int, num_classes: int):
    """torchvision's resnet18/resnet50 when installed, otherwise the same architecture written here."""
    try:
        import torchvision

        ctor = torchvision.models.resnet18 if depth == 18 else torchvision.models.resnet50
        return ctor(weights=None, num_classes=num_classes), "torchvision resnet%d" % depth
    except ImportError:
        pass
    nn = torch.nn

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                      nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(cout))
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.down is None else self.down(x)
            return torch.relu(self.body(x) + idt)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                      nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                                      nn.ReLU(inplace=True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.down is None else self.down(x)
            return torch.relu(self.body(x) + idt)

    block, counts = (Basic, (2, 2, 2, 2)) if depth == 18 else (Bottleneck, (3, 4, 6, 3))
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, stride, n in zip((64, 128, 256, 512), (1, 2, 2, 2), counts):
        for i in range(n):
            layers.append(block(cin, width, stride if i == 0 else 1))
            cin = width * block.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model, "builtin resnet%d" % depth


def _transformer(torch, vocab: int, d: int, layers: int, heads: int, seq: int):
    nn = torch.nn

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
            return self.head(self.norm(x))

    return Decoder(), "decoder %d layers d=%d seq %d" % (layers, d, seq)


def train(args) -> dict:
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if args.allocator == "gpumem-plain":
        os.environ["GPUMEM_EXPANDABLE"] = "0"
    if args.allocator.startswith("gpumem"):
        import gpumem.torch  # before any CUDA tensor exists

        gpumem.torch.enable(device=0)
    import torch

    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    # attention through the math kernels: the fused ones' backward is not deterministic
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)
    gen = torch.Generator().manual_seed(args.seed + 1)
    dev = torch.device("cuda", 0)

    if args.model.startswith("transformer"):
        vocab, seq = 32768, args.seq
        model, arch = _transformer(torch, vocab, 768, 12, 12, seq)
        if args.model == "transformer_dyn":
            # the same draws in every run: the shapes, and so the allocations, repeat across allocators
            shapes = [(int(torch.randint(max(1, args.batch // 2), 2 * args.batch + 1, (1,), generator=gen)),
                       int(torch.randint(max(1, seq // 4), seq + 1, (1,), generator=gen))) for _ in range(args.steps)]
            xs = [torch.randint(0, vocab, (b, t + 1), generator=gen) for b, t in shapes]
            batches = [(x[:, :-1], x[:, 1:]) for x in xs]
            arch += ", batch %d-%d, sequence %d-%d per step" % (max(1, args.batch // 2), 2 * args.batch,
                                                                max(1, seq // 4), seq)
        else:
            xs = torch.randint(0, vocab, (args.steps, args.batch, seq + 1), generator=gen)
            batches = [(xs[s, :, :-1], xs[s, :, 1:]) for s in range(args.steps)]
        model = model.to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

        def step_loss(x, y):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
            return torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
    else:
        model, arch = _resnet(torch, 18 if args.model == "resnet18" else 50, args.classes)
        images = torch.randn(args.steps, args.batch, 3, args.image_size, args.image_size, generator=gen)
        labels = torch.randint(0, args.classes, (args.steps, args.batch), generator=gen)
        batches = [(images[s], labels[s]) for s in range(args.steps)]
        model = model.to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step_loss(x, y):
            return loss_fn(model(x), y)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(0)
    losses, times = [], []
    for step, (xb, yb) in enumerate(batches):
        t0 = time.perf_counter()
        x = xb.to(dev, non_blocking=False)
        y = yb.to(dev, non_blocking=False)
        opt.zero_grad(set_to_none=True)
        loss = step_loss(x, y)
        loss.backward()
        opt.step()
        value = loss.item()  # synchronises
        times.append(time.perf_counter() - t0)
        losses.append(value)
        print("step %3d loss %.9f (%s) %.1f ms" % (step, value, float.hex(value), times[-1] * 1e3), flush=True)
    torch.cuda.synchronize()
    warm = sorted(times[3:]) if len(times) > 3 else sorted(times)
    extra = {}
    if args.allocator.startswith("gpumem"):
        import gpumem.torch

        st = gpumem.torch.context().stats(0)
        extra = {k: st[k] for k in ("num_backend_allocs", "num_backend_frees", "num_trims", "num_segments",
                                    "num_allocs") if k in st}
    return {
        "gpumem_stats": extra,
        "allocator": args.allocator,
        "model": args.model,
        "arch": arch,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "steps": args.steps,
        "batch": args.batch,
        "losses": losses,
        "losses_hex": [float.hex(v) for v in losses],
        "median_step_ms": warm[len(warm) // 2] * 1e3,
        "total_step_ms": sum(warm) * 1e3,  # after the warm-up steps: with dynamic shapes, every step counts
        "max_memory_allocated": torch.cuda.max_memory_allocated(0),
        "max_memory_reserved": torch.cuda.max_memory_reserved(0),
        "allocator_backend": torch.cuda.get_allocator_backend(),
    }


def compare(paths) -> int:
    runs = [json.load(open(p)) for p in paths]
    base = runs[0]
    status = 0
    print("| model | allocator | losses vs %s (first run) | median step | steps after warm-up, total | peak allocated | peak reserved | reserved / allocated |"
          % base["allocator"])
    print("|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs):
        a, b = base["losses"], r["losses"]
        if i == 0:
            verdict = "reference (%d steps)" % len(a)
        elif len(a) != len(b):
            verdict, ok = "MISMATCH: %d vs %d steps" % (len(a), len(b)), False
            status = 1
        else:
            exact = sum(x == y for x, y in zip(a, b))
            max_rel = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
            ok = max_rel <= 1e-6
            verdict = "%s: %d/%d bitwise equal, max rel diff %.2g" % ("MATCH" if ok else "MISMATCH", exact, len(a), max_rel)
            status |= 0 if ok else 1
        label = r["allocator"] + (" (again)" if any(q["allocator"] == r["allocator"] for q in runs[:i]) else "")
        print("| %s | %s | %s | %.2f ms | %.1f ms | %.0f MiB | %.0f MiB | %.3f |" % (
            r["model"], label, verdict, r["median_step_ms"], r.get("total_step_ms", float("nan")),
            r["max_memory_allocated"] / MiB,
            r["max_memory_reserved"] / MiB, r["max_memory_reserved"] / max(r["max_memory_allocated"], 1)))
    return status


def run_all(args) -> int:
    env = dict(os.environ)
    if os.path.isdir(os.path.join(BINDINGS, "gpumem")):
        env["PYTHONPATH"] = BINDINGS + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    status = 0
    outdir = args.out_dir or tempfile.mkdtemp(prefix="torch_train_")
    os.makedirs(outdir, exist_ok=True)
    for model in args.all:
        paths = []
        for alloc, tag in (("torch", "torch"), ("expandable", "expandable"), ("gpumem", "gpumem"),
                           ("torch", "torch-again")):
            path = os.path.join(outdir, "%s-%s.json" % (model, tag))
            cmd = [sys.executable, os.path.abspath(__file__), "--model", model, "--allocator", alloc, "--out", path,
                   "--steps", str(args.steps)]
            if args.batch:
                cmd += ["--batch", str(args.batch)]
            log = open(path[:-5] + ".log", "w")
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            log.close()
            if rc != 0:
                print("%s with %s: exit %d (log: %s)" % (model, alloc, rc, log.name))
                status = 1
                continue
            paths.append(path)
        if paths:
            status |= compare(paths)
        print()
    return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocator", choices=ALLOCATORS, default="torch")
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=None, help="default: 64 images, 8 sequences")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--lr", type=float, default=None, help="default: 0.01 (SGD, ResNet), 3e-4 (AdamW, transformer)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--out-dir", help="with --all: where the JSON files and logs go")
    p.add_argument("--compare", nargs="+", metavar="JSON", help="compare result files (first is the reference)")
    p.add_argument("--all", nargs="+", metavar="MODEL", choices=MODELS,
                   help="run torch, expandable, gpumem and torch again for each model, and compare")
    args = p.parse_args()
    if args.compare:
        return compare(args.compare)
    if args.all:
        return run_all(args)
    if args.batch is None:
        args.batch = 8 if args.model.startswith("transformer") else 64
    if args.lr is None:
        args.lr = 3e-4 if args.model.startswith("transformer") else 0.01
    result = train(args)
    print("median step %.2f ms, max_memory_allocated %.0f MiB, max_memory_reserved %.0f MiB %s" % (
        result["median_step_ms"], result["max_memory_allocated"] / MiB, result["max_memory_reserved"] / MiB,
        json.dumps(result["gpumem_stats"]) if result["gpumem_stats"] else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
