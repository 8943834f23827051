"""`nextok train medusa MODEL OUT --data code --steps N`: trains Medusa heads
(spec/medusa_heads.py) on a frozen model, on real code.

Data: windows of --seq-len tokens from the training (calibration) split of this Python's
standard library (bench/datasets.py), never a file of the held-out eval split that
`nextok eval ppl` and `nextok bench spec --held-out` read. Files are taken in a seeded shuffle,
at most --windows-per-file windows each, spread over the file; the first --val-windows windows
(whole files) are kept apart to report how often the heads agree with the model.

1. The model's final hidden states of --pool-windows windows are computed once with nextok's own
   model (eval/ppl.py's WindowScorer: scratch blocks of the idle engine's KV pool) and kept in
   memory in bfloat16, with each position's greedy token (the model's argmax there).
2. --steps AdamW steps on batches of --batch windows drawn from that pool (epochs when the
   steps need more windows than it holds); linear warm-up, cosine decay. Head i at position t
   learns the token at t + 2 + i: the data's (--labels data) or the model's own greedy choice
   there given the data before it (--labels model, a cheap self-distillation). Loss: cross
   entropy, head i weighted 0.8^i (Medusa's); the vocabulary projection and the loss in bfloat16
   (autocast) where the device computes bfloat16 natively (a GPU, a CPU with AVX512-BF16 or AMX),
   else in float32; the heads' weights and optimiser state in float32.
3. Validation on the kept-apart windows: per head, how often its argmax equals the model's greedy
   token; and the mean length of the run of heads from head 0 that all do ("chain"), a
   teacher-forced estimate of the drafts accepted per verify step.
"""
from __future__ import annotations

import json
import math
import os
import random
import time

import torch
from torch.nn import functional as F

from nextok.bench.common import header
from nextok.errors import NextokError
from nextok.platform import cpu_has_native_bf16
from nextok.spec.medusa_heads import MedusaHeads, base_identity

LOSS_DECAY = 0.8  # head i's loss weight: LOSS_DECAY ** i
GENERATE_BATCH = 32  # --generate: continuations written together (the KV pool holds them)


def add_parser(sub) -> None:
    train = sub.add_parser("train", help="train small models on top of a model (medusa heads)")
    train_sub = train.add_subparsers(dest="train_command", metavar="WHAT")
    p = train_sub.add_parser("medusa", help="train Medusa heads for --speculative medusa")
    p.add_argument("model", help="GGUF file, Hugging Face directory, or alias of the base model")
    p.add_argument("out", help="output directory (medusa_heads.safetensors, training.json)")
    p.add_argument("--data", default="code", choices=["code"],
                   help="code: the training split of this Python's standard library")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--projection", default="shared", choices=["shared", "own"],
                   help="shared: the model's frozen lm_head; own: a trainable copy per head")
    p.add_argument("--labels", default="model", choices=["data", "model"],
                   help="targets: the data's tokens, or the model's greedy token at each place")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=8, help="windows per step")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per window")
    p.add_argument("--pool-windows", type=int, default=384,
                   help="windows whose hidden states are computed once and trained on")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="self-distillation: each window's last N tokens are the model's own greedy "
                        "continuation of the file's first seq-len - N (what heads guess when serving)")
    p.add_argument("--windows-per-file", type=int, default=4)
    p.add_argument("--val-windows", type=int, default=32)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--load-format", default="auto", choices=["auto", "gguf", "safetensors", "dummy"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from nextok import LLM

    check_args(args)
    llm = LLM(model=args.model, tokenizer=args.tokenizer, load_format=args.load_format,
              device=args.device, dtype="float32", num_threads=args.num_threads, seed=args.seed,
              cpu_kernels=False, enable_prefix_caching=False, max_num_seqs=GENERATE_BATCH,
              num_kv_blocks=GENERATE_BATCH * (-(-args.seq_len // 16) + 1) + 2)
    result = train(llm, args)
    print(f"wrote {result['file']}")
    return 0


def check_args(args) -> None:
    for name in ("steps", "heads", "batch", "pool_windows", "windows_per_file", "val_windows"):
        if getattr(args, name) < 1:
            raise NextokError(f"--{name.replace('_', '-')} must be >= 1")
    if args.seq_len < args.heads + 2:
        raise NextokError(f"--seq-len must be at least --heads + 2 = {args.heads + 2}")
    if not 0 <= args.generate < args.seq_len:
        raise NextokError(f"--generate must be in [0, --seq-len - 1], got {args.generate}")
    if not args.lr > 0:
        raise NextokError("--lr must be > 0")


def training_windows(tokenizer, seq_len: int, per_file: int, num: int, seed: int) -> list[list[int]]:
    """Up to `num` windows of seq_len tokens from training-split files in a seeded shuffle, at most
    per_file from each, spread evenly over the file (non-overlapping): not only its start, whose
    license, imports and docstring are easier to guess than the code serving sees."""
    from nextok.bench.datasets import CALIBRATION_SPLIT, stdlib_split

    files = stdlib_split()[CALIBRATION_SPLIT]
    random.Random(seed).shuffle(files)
    windows: list[list[int]] = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                ids = tokenizer.encode(f.read(), add_special_tokens=False)
        except (OSError, UnicodeDecodeError):
            continue
        count = min(per_file, len(ids) // seq_len)
        for j in range(count):
            start = j * (len(ids) - seq_len) // max(1, count - 1)
            windows.append(ids[start:start + seq_len])
            if len(windows) == num:
                return windows
    return windows


def self_distilled(llm, windows: list[list[int]], generate: int) -> list[list[int]]:
    """Each window's last `generate` tokens replaced by the model's greedy continuation of the
    rest (EOS ignored, so every window keeps its length)."""
    from nextok import SamplingParams

    if generate == 0:
        return windows
    keep = len(windows[0]) - generate
    params = SamplingParams(temperature=0.0, max_tokens=generate, ignore_eos=True)
    outs = llm.generate([w[:keep] for w in windows], params)
    return [w[:keep] + o.outputs[0].token_ids for w, o in zip(windows, outs)]


@torch.inference_mode()
def hidden_pool(llm, windows: list[list[int]]) -> dict[str, torch.Tensor]:
    """hidden [W, L, hidden] bfloat16, ids [W, L], greedy [W, L] (the model's argmax at each
    position: its guess for the next token), on the model's device."""
    from nextok.eval.ppl import WindowScorer

    seq_len = len(windows[0])
    scorer = WindowScorer(llm, seq_len + 1)
    ids = torch.tensor(windows, dtype=torch.long, device=scorer.device)  # [W, L]
    hidden = torch.empty(len(windows), seq_len, scorer.model.config.hidden_size,
                         dtype=torch.bfloat16, device=scorer.device)
    greedy = torch.empty_like(ids)
    step = scorer.batch_size(seq_len)
    for w in range(0, len(windows), step):
        h = scorer.hidden_many(ids[w:w + step])  # [B, L, hidden]
        hidden[w:w + step] = h
        logits = scorer.model.compute_logits(h.flatten(0, 1))  # [B * L, vocab]
        greedy[w:w + step] = logits.argmax(dim=-1).view(h.shape[:2])
    return {"hidden": hidden, "ids": ids, "greedy": greedy}


def targets(pool: dict, idx: torch.Tensor, head: int, labels: str) -> torch.Tensor:
    """[B, L - 2 - head]: head `head`'s target at positions 0 .. L - 3 - head of windows idx."""
    if labels == "data":
        return pool["ids"][idx, 2 + head:]
    return pool["greedy"][idx, 1 + head:-1]  # the model's guess at t + 1 + head for t + 2 + head


def bf16_autocast(device: torch.device) -> torch.autocast:
    """autocast to bfloat16 where the device multiplies it natively, else a disabled one: on
    a CPU without AVX512-BF16 or AMX (an AVX2 EPYC) torch emulates it, and a head's loss and
    its backward took 27x float32's time (15.2 s against 0.57, one thread)."""
    fast = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_native_bf16()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=fast)


def head_loss(heads: MedusaHeads, head: int, h: torch.Tensor, target: torch.Tensor,
              base_weight: torch.Tensor) -> torch.Tensor:
    """h [B, L, hidden] float32 -> mean cross entropy of head `head` over positions 0..L-3-head."""
    n = target.shape[1]
    x = h[:, :n].reshape(-1, h.shape[-1])
    z = F.linear(x, heads.weight[head], heads.bias[head])
    x = x + F.silu(z)  # as MedusaHeads.residual
    w = base_weight if heads.proj is None else heads.proj[head]
    with bf16_autocast(h.device):
        logits = F.linear(x, w)  # [B * n, vocab] bfloat16 (float32 without native bfloat16)
    # In bfloat16 too (its reductions accumulate in float32): ~1.7x faster than on a float32
    # copy of the logits on the 2-core Xeon, where this loss is most of a step's time.
    return F.cross_entropy(logits, target.reshape(-1)).float()


def lr_at(step: int, steps: int, lr: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def train(llm, args) -> dict:
    model = llm.engine.runner.model
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = model.config
    # the vocabulary projection [vocab, hidden] (a packed lm_head has no .weight: an untied
    # model trains with cpu_kernels=False, as `run` loads it)
    base_weight = model.embed_tokens.weight if cfg.tie_word_embeddings else model.lm_head.weight
    t0 = time.perf_counter()
    windows = training_windows(llm.get_tokenizer(), args.seq_len, args.windows_per_file,
                               args.val_windows + args.pool_windows, args.seed)
    if len(windows) < args.val_windows + 1:
        raise NextokError(f"only {len(windows)} training windows of {args.seq_len} tokens found")
    windows = self_distilled(llm, windows, args.generate)
    val = hidden_pool(llm, windows[:args.val_windows])
    pool = hidden_pool(llm, windows[args.val_windows:])
    num = pool["ids"].shape[0]
    hidden_s = time.perf_counter() - t0
    print(f"hidden states: {num} + {args.val_windows} (validation) windows of {args.seq_len} tokens "
          f"({args.generate} written by the model) in {hidden_s:.0f} s", flush=True)
    heads = MedusaHeads(args.heads, cfg.hidden_size, cfg.vocab_size, args.projection, base_weight)
    heads.to(base_weight.device)
    opt = torch.optim.AdamW(heads.parameters(), lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(num, generator=gen)
    at, curve = 0, []
    t1 = time.perf_counter()
    for step in range(args.steps):
        if at + args.batch > num:  # next epoch
            order, at = torch.randperm(num, generator=gen), 0
        idx = order[at:at + args.batch].to(base_weight.device)
        at += args.batch
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        h = pool["hidden"][idx].float()  # [B, L, hidden]
        opt.zero_grad(set_to_none=True)
        losses = []
        for i in range(args.heads):  # one head at a time: one [B * L, vocab] logits at once
            loss = head_loss(heads, i, h, targets(pool, idx, i, args.labels), base_weight)
            (loss * LOSS_DECAY ** i).backward()
            losses.append(loss.item())
        opt.step()
        curve.append(losses)
        if step % max(1, args.steps // 20) == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss per head " + " ".join(f"{x:.3f}" for x in losses)
                  + f"  ({time.perf_counter() - t1:.0f} s)", flush=True)
    train_s = time.perf_counter() - t1
    report = validate(heads, val, base_weight)
    print("validation (teacher-forced, vs the model's greedy token): head accuracy "
          + " ".join(f"{a:.3f}" for a in report["head_accuracy"])
          + f"; chain {report['chain']:.3f} heads agree from head 0", flush=True)
    summary = {"base_model": os.path.basename(llm.engine.config.model_path), "data": args.data,
               "split": "calibration", "steps": args.steps, "batch": args.batch,
               "seq_len": args.seq_len, "generate": args.generate, "lr": args.lr, "labels": args.labels,
               "pool_windows": num, "val_windows": args.val_windows, "seed": args.seed,
               "hidden_seconds": round(hidden_s, 1), "train_seconds": round(train_s, 1),
               "first_loss": curve[0], "final_loss": _mean_last(curve), **report}
    file = heads.save(args.out, base_identity(model), {"base_model": summary["base_model"],
                                                       "training": summary})
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(header({**summary, "loss_curve": curve}), f, indent=1)  # + commit, machine, command
    return {"file": file, "heads": heads, **summary}


def _mean_last(curve: list[list[float]], n: int = 10) -> list[float]:
    tail = curve[-n:]
    return [sum(step[i] for step in tail) / len(tail) for i in range(len(tail[0]))]


@torch.no_grad()
def validate(heads: MedusaHeads, val: dict, base_weight: torch.Tensor, chunk: int = 256) -> dict:
    """Per head, the share of positions where its argmax is the model's greedy token there, and
    the mean number of heads from head 0 in a row that all are (over positions where every head
    has a target), in chunks of `chunk` positions."""
    num_heads = heads.num_heads
    usable = val["ids"].shape[1] - 1 - num_heads  # positions t with t + num_heads <= L - 1
    h = val["hidden"][:, :usable].reshape(-1, heads.hidden_size)  # [N, hidden]
    want = torch.stack([val["greedy"][:, 1 + i:1 + i + usable].reshape(-1)
                        for i in range(num_heads)], dim=1)  # [N, H]: the greedy token at t + 2 + i
    agree = []
    for a in range(0, h.shape[0], chunk):
        with bf16_autocast(h.device):
            logits = heads.logits(h[a:a + chunk].float(), lambda x: F.linear(x, base_weight))
        agree.append(logits.argmax(-1) == want[a:a + chunk])  # [chunk, H]
    agree = torch.cat(agree)
    chain = agree.int().cumprod(dim=1).sum(dim=1).float().mean().item()
    return {"head_accuracy": agree.float().mean(dim=0).tolist(), "chain": chain}
