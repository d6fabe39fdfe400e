"""Every preset's logits and parameter gradients at a fixed seed, saved or compared bit for bit.

    python benchmarks/preset_snapshot.py save runs/presets.pt      # before a change
    python benchmarks/preset_snapshot.py compare runs/presets.pt   # after it: torch.equal per tensor

A refactor that must not change behaviour (the model, its initialisation, the order of its floating-point
operations) leaves every tensor equal; the comparison prints one line per preset and exits 1 on any difference.
Float64, one thread, d_model 32, 2 heads, every layer of the preset's pattern (at least 2: HOPE's four levels),
T 70 (a partial chunk for every chunk size in use, and TNT's local memories reset at token 64).
"""
import argparse
import sys

import torch

from atlas_lab.models import PRESETS, LanguageModel


def snapshot(name: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    layers = max(2, len(PRESETS[name]["layers"]))
    model = LanguageModel(vocab_size=37, preset=name, d_model=32, n_layers=layers, n_heads=2, swa_window=8).double()
    ids = torch.randint(0, 37, (2, 70), generator=torch.Generator().manual_seed(1))
    logits = model(ids)[0]  # (logits, cache)
    logits.square().mean().backward()
    out = {"logits": logits.detach()}
    out.update({f"grad.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["save", "compare"])
    parser.add_argument("path")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.action == "save":
        torch.save({name: snapshot(name) for name in PRESETS}, args.path)
        print(f"saved {len(PRESETS)} presets to {args.path}")
        return
    saved, bad = torch.load(args.path), 0
    for name in PRESETS:
        if name not in saved:
            print(f"{name:20s} new (not in {args.path})")
            continue
        now, before = snapshot(name), saved[name]
        differ = sorted(n for n in before.keys() | now.keys()
                        if n not in now or n not in before or not torch.equal(now[n], before[n]))
        bad += bool(differ)
        print(f"{name:20s} {'equal' if not differ else 'DIFFERS: ' + ', '.join(differ[:4])} "
              f"({len(before)} tensors)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
