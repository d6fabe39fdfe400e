"""Throughput of `atlas-lab data prepare` (atlas_lab.data.shards): tokens per second from text files to litdata shards.

    python benchmarks/prepare.py [--mb 20] [--workers 1 2] [--vocab-size 8192] [--holdout-fraction 0.01]
                                 [--repeats 1] [--tiny]

A synthetic corpus of --mb MB is written first (4 .jsonl files; documents of 200–5,000 characters of Zipf-distributed
pseudo-words over 20,000 words of 2–10 letters, with punctuation and line breaks). Then, each timed on its own:
prepare with the byte tokenizer at each --workers (litdata writer processes), the BPE tokenizer's training
(`atlas-lab data tokenizer`, --vocab-size) and prepare with it at each --workers. Columns: seconds (median of
--repeats, no warm-up: each run reads the whole corpus), documents, tokens, tokens/s and input MB/s. Tokenising runs
in the main process (the `tokenizers` library uses its own threads for BPE); --workers only parallelises the writing.
Checks first: the shards hold every token (the train and val tokens of corpus.json = the sum of the chunks' tokens).
Writes runs/bench/prepare.json (--tiny: prepare.tiny.json, a run-through on 0.2 MB).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

import numpy as np
from common import add_common_args, apply_tiny, median_time, meta, out_path, print_table, set_threads, write_json

from atlas_lab.data.shards import prepare, train_tokenizer


def write_corpus(folder: Path, megabytes: float, seed: int = 0) -> list[str]:
    """4 .jsonl files of about megabytes MB together; returns their paths."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, rng.integers(2, 11))) for _ in range(20_000)])
    p = 1 / np.arange(1, len(words) + 1)
    p /= p.sum()
    seps = np.array([" "] * 12 + [", ", ". ", ".\n"])
    target, paths = megabytes * 1e6 / 4, []
    for f in range(4):
        lines, size = [], 0
        while size < target:
            n = int(rng.integers(200, 5000)) // 6
            tokens = rng.choice(words, n, p=p)
            text = "".join(np.char.add(tokens, rng.choice(seps, n)))
            lines.append(json.dumps({"text": text}))
            size += len(lines[-1]) + 1
        path = folder / f"part-{f}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def shard_tokens(out: Path) -> int:
    return sum(c["dim"] for s in ("train", "val") for c in json.loads((out / s / "index.json").read_text())["chunks"])


def main(argv=None):
    ap = add_common_args(argparse.ArgumentParser(description=__doc__), repeats=1)
    ap.add_argument("--mb", type=float, default=20.0, help="corpus size (MB of .jsonl)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--holdout-fraction", type=float, default=0.01)
    args = apply_tiny(ap.parse_args(argv), dict(mb=0.2, workers=[1], vocab_size=512, holdout_fraction=0.2,
                                                repeats=1))
    threads = set_threads(args.threads)
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        inputs = write_corpus(tmp, args.mb)
        megabytes = sum(Path(p).stat().st_size for p in inputs) / 1e6
        runs = [("byte", w) for w in args.workers] + [("tokenizer", None)] + [("bpe", w) for w in args.workers]
        for kind, workers in runs:
            results = []

            def run():
                n = len(results)
                with contextlib.redirect_stdout(io.StringIO()):  # the progress bars
                    if kind == "tokenizer":
                        train_tokenizer(inputs, str(tmp / f"tok-{n}.json"), args.vocab_size)
                        results.append(None)
                        return
                    tokenizer = "byte" if kind == "byte" else str(tmp / "tok-0.json")
                    out = tmp / f"{kind}-{workers}-{n}"
                    results.append((prepare(inputs, str(out), tokenizer, holdout_fraction=args.holdout_fraction,
                                            num_workers=workers), out))

            seconds = median_time(run, args.repeats, warmup=0)
            if kind == "tokenizer":
                record = dict(run=f"train BPE tokenizer (vocab {args.vocab_size})", seconds=seconds,
                              mb_per_s=megabytes / seconds)
                rows.append([record["run"], f"{seconds:.1f}", None, None, None, f"{megabytes / seconds:.2f}"])
            else:
                corpus, out = results[-1]
                documents = sum(s["documents"] for s in corpus["splits"].values())
                tokens = sum(s["tokens"] for s in corpus["splits"].values())
                assert shard_tokens(out) == tokens, (shard_tokens(out), tokens)
                record = dict(run=f"prepare {kind}, {workers} worker(s)", seconds=seconds, documents=documents,
                              tokens=tokens, tokens_per_s=tokens / seconds, mb_per_s=megabytes / seconds)
                rows.append([record["run"], f"{seconds:.1f}", f"{documents:,}", f"{tokens:,}",
                             f"{tokens / seconds:,.0f}", f"{megabytes / seconds:.2f}"])
            records.append(record)
    print_table(f"atlas-lab data prepare on {megabytes:.1f} MB of synthetic .jsonl ({args.repeats} repeat(s))",
                ["run", "s", "documents", "tokens", "tokens/s", "MB/s"], rows)
    write_json(out_path("prepare", args), dict(meta(args), megabytes=megabytes, threads=threads, rows=records))


if __name__ == "__main__":
    main()
