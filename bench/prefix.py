"""Prefix order: a shuffled shared-prefix file through ``vllm run-batch`` and through the stack.

``python -m bench --only prefix [--input FILE] [--kv-cache-tokens N]``. Without ``--input`` it
makes two shared-prefix workloads, shuffled: documents x questions, and few-shot templates x
inputs. With ``--input`` it takes any chat-completions JSONL file as given (``body.model``
replaced by the benchmark's model). Both sides run the same model with the same engine settings
(prefix caching on, as vLLM's default; the KV cache sized alike by ``num_gpu_blocks_override``);
rounds alternate which goes first.

Figures per side: output tokens/s (timed as in ``parity.py``), the prefix-cache hit rate
(``cached_tokens`` over prompt tokens, summed over the output file's ``usage``) and the prefill
tokens computed (prompt tokens minus cached). A third side, ``run-batch grouped``, is run-batch
on the same lines sorted by their messages (lines sharing a prefix adjacent, as a user could sort
a file by hand): what the order alone is worth to the engine, the yardstick of the stack's ratio.
The ideal is each distinct prefix computed once:
the prompts' token ids (the model's own tokenizer and chat template) in a trie, counted in whole
KV blocks as vLLM caches them. The last line is ``prefix: X.XXx run-batch``.

The input, the ideal and the sides are in ``prefix_input``, ``prefix_ideal`` and ``prefix_sides``.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path
from typing import Any

from bench.common import median, table
from bench.parity import engine_env
from bench.prefix_ideal import fitting_model_len, ideal
from bench.prefix_input import SERVED_NAME, documents_lines, fewshot_lines, given_lines
from bench.prefix_sides import GROUPED, compare, two_workers


def run(args: Any) -> dict[str, Any]:
    if not Path(args.prefix_model_dir, "config.json").exists():
        raise SystemExit(f"no model at {args.prefix_model_dir} (make bench prepares Gemma 3 270M)")
    args = argparse.Namespace(
        **{**vars(args), "model_dir": args.prefix_model_dir, "served_name": SERVED_NAME}
    )
    work = Path(tempfile.mkdtemp(prefix="batchstream-prefix-"))
    input_path = work / "in.jsonl"
    if args.input:
        lines = given_lines(args.input)
        workload = f"{args.input} ({len(lines)} lines)"
    else:
        lines = documents_lines(
            args.prefix_documents, args.prefix_questions, args.prefix_doc_words, 8, seed=1
        )
        lines += fewshot_lines(args.prefix_templates, args.prefix_inputs, 6, 8, seed=1)
        random.Random(2).shuffle(lines)
        workload = (
            f"{args.prefix_documents} documents x {args.prefix_questions} questions + "
            f"{args.prefix_templates} few-shot templates x {args.prefix_inputs} inputs, shuffled"
        )
    input_path.write_text("\n".join(lines) + "\n")
    os.environ.update(engine_env(args.kv_cache_gib))
    block = args.kv_block_tokens
    best = ideal(args.inference_python, args.model_dir, input_path, block)
    if not args.prefix_max_model_len:
        args.prefix_max_model_len = fitting_model_len(lines, best["longest"], block, args.max_model_len)
    args.max_model_len = args.prefix_max_model_len  # both sides' engines
    # vLLM refuses a cache that cannot hold one request of max_model_len.
    wanted = max(args.kv_cache_tokens or best["distinct_shared"] // 2, args.max_model_len + block)
    print(
        f"prefix: {len(lines)} lines, {best['prompt_tokens']:,} prompt tokens, shared prefixes "
        f"{best['distinct_shared']:,} tokens; a small KV cache of about {wanted:,} tokens",
        flush=True,
    )
    rounds = compare(args, input_path, work, wanted, "small") if args.prefix_caches != "room" else []
    if not args.kv_cache_tokens and args.prefix_caches != "small":
        rounds += compare(args, input_path, work, 0, "room")
    pair = (
        [two_workers(args, input_path, wanted, flag) for flag in (True, False)] if args.prefix_pairs else []
    )

    def med(cache: str, system: str, key: str) -> float:
        return median(x[key] for x in rounds if x["system"] == system and x["cache"] == cache)

    print()
    print(
        table(
            f"Prefix order: {workload}; max_num_seqs={args.max_num_seqs}, "
            f"max_model_len={args.max_model_len}, dtype {args.prefix_dtype}; KV cache small: about "
            f"{wanted:,} tokens, room: the memory setting's ({args.kv_cache_gib} GiB)",
            [
                "cache",
                "round",
                "system",
                "timed s",
                "validate s",
                "finalize s",
                "tok/s",
                "hit rate",
                "prefill computed",
                "prompt tokens",
            ],
            [
                [
                    x["cache"],
                    x["round"],
                    x["system"],
                    x["timed_s"],
                    x.get("validate_s", float("nan")),
                    x.get("finalize_s", float("nan")),
                    x["tokens_per_s"],
                    x["hit_rate"],
                    x["computed"],
                    x["prompt_tokens"],
                ]
                for x in rounds
            ],
        )
    )
    ideal_computed = max(1, best["ideal_computed"])
    summary: dict[str, Any] = {}
    for cache in sorted({x["cache"] for x in rounds}, key=lambda c: c != "small"):
        ratio = med(cache, "batchstream", "tokens_per_s") / med(cache, "run-batch", "tokens_per_s")
        summary[cache] = {
            "ratio": ratio,
            "run_batch_computed_over_ideal": med(cache, "run-batch", "computed") / ideal_computed,
            "batchstream_computed_over_ideal": med(cache, "batchstream", "computed") / ideal_computed,
            "grouped_computed_over_ideal": med(cache, GROUPED, "computed") / ideal_computed,
            "grouped_over_run_batch": med(cache, GROUPED, "tokens_per_s")
            / med(cache, "run-batch", "tokens_per_s"),
            "run_batch_hit_rate": med(cache, "run-batch", "hit_rate"),
            "batchstream_hit_rate": med(cache, "batchstream", "hit_rate"),
        }
        s = summary[cache]
        print(
            f"{cache} cache: batchstream/run-batch tokens/s {ratio:.2f}x; hit rate "
            f"{s['run_batch_hit_rate']:.1%} run-batch, {s['batchstream_hit_rate']:.1%} batchstream; "
            f"prefill computed / ideal ({best['ideal_computed']:,} tokens): "
            f"{s['run_batch_computed_over_ideal']:.2f}x run-batch, "
            f"{s['batchstream_computed_over_ideal']:.2f}x batchstream, "
            f"{s['grouped_computed_over_ideal']:.2f}x run-batch grouped; run-batch on the file "
            f"sorted by hand: {s['grouped_over_run_batch']:.2f}x run-batch; vLLM's cache: "
            f"{next((x['kv_cache'] for x in rounds if x['cache'] == cache and x.get('kv_cache')), '?')}"
        )
    for x in pair:
        print(
            f"two workers, affinity {'on ' if x['affinity'] else 'off'}: hit rate {x['hit_rate']:.1%}, "
            f"prefill computed {x['computed']:,}, {x['tokens_per_s']:.1f} tok/s"
        )
    print(f"prefix: {summary['small' if 'small' in summary else 'room']['ratio']:.2f}x run-batch")
    return {
        "workload": workload,
        "ideal": best,
        "kv_cache": {"small_tokens_wanted": wanted, "block_tokens": block},
        "rounds": rounds,
        "two_workers": pair,
        "summary": summary,
    }
