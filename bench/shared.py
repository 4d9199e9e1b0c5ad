"""Shared server: a batch drains through batchstream to a server that also serves live traffic.

``python -m bench --only shared [--engine sim]``. One ``vllm serve`` on this machine (with
``--engine sim``, the simulated GPU behind an OpenAI-compatible server, ``bench/sim_server.py``:
its figures are ratios, docs/benchmarks.md) (``--shared-model-dir``,
Gemma 3 270M in float32 by default, ``--shared-max-num-seqs`` sequences at once), then:

1. **Capacity.** Batch-shaped requests (``--shared-max-tokens`` output tokens each) sent straight to
   the server, as many at once as it runs, for ``--shared-seconds``: the server's output tokens/s
   when a batch has it alone (what ``vllm run-batch`` reaches on its own engine: every sequence
   busy). Then live-shaped requests (a short question, ``--live-max-tokens``) the same way: the
   live requests/s the server sustains.
2. **Live alone.** A live client sends live requests at a fixed rate (``--live-share`` of what the
   server sustains, open loop: a request leaves on time whether or not the last came back) for
   ``--shared-seconds``; each one's latency.
3. **Live during a batch**, for each admission setting: the stack (stand-ins, api, aggregator and a
   remote worker forwarding to the server) runs a batch large enough to outlast the window; once
   its lines flow, the same live client runs again. The batch's tokens/s in the window is the
   server's own output-token counter (``vllm:generation_tokens_total``) minus the live answers'
   tokens. Spare capacity is (1) minus the live load's tokens/s; the batch's share is its tokens/s
   over that. The batch is then cancelled (the server aborts its lines) before the next setting.

On a GPU a decode step costs about the same with a few more sequences in it, so the live latency
barely moves while the batch fills the spare room. On this CPU every sequence added makes each
step slower for everyone, so live latency and the batch's share trade against each other: the
settings (how many lines the worker may keep on the server, admission on or off) print that
trade-off. The last line is ``shared: live p99 X.XXx alone, batch Y% of spare capacity`` for the
default settings.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
from openai import OpenAI

from bench.common import MongoPoller, create_batch, median, new_stack, percentile, start_stack, table
from bench.sim_server import SimServer
from deploy.local import ModelSpec
from deploy.local.model_server import ModelServer
from deploy.local.probes import metric_value, poll_until
from deploy.local.vllm_serve import VllmServer

SERVED_NAME = "shared-model"
CHAT: Final = "/v1/chat/completions"
TOPICS = "a river, a lighthouse, the moon, a market, an old clock, a storm, bread, a garden".split(", ")


@dataclass
class Setting:
    """One admission setting of the remote worker, as its environment."""

    name: str
    env: dict[str, str]


def settings(max_num_seqs: int) -> list[Setting]:
    """The default first (its figures make the last line), then the trade-off."""
    half, quarter = max(1, max_num_seqs // 2), max(1, max_num_seqs // 4)
    return [
        Setting(f"admission, up to {max_num_seqs} (default)", {}),
        Setting(f"admission, up to {half}", {"BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(half)}),
        Setting(f"admission, up to {quarter}", {"BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(quarter)}),
        Setting(f"no admission, {max_num_seqs} always", {"BATCHSTREAM_INFERENCE_REMOTE_ADMISSION": "false"}),
    ]


def batch_body(i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "messages": [
            {"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}, part {i}."}
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def live_body(i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": f"In one line: what is {TOPICS[i % len(TOPICS)]}?"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def generated(server: ModelServer) -> float:
    return metric_value(f"{server.url}/metrics", "vllm:generation_tokens_total")


async def saturate(server: ModelServer, body: Any, seconds: float) -> dict[str, float]:
    """Requests ``body(i)`` kept ``max_num_seqs`` at once for ``seconds``: requests/s, tokens/s."""
    done = tokens = 0
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:

        async def worker(k: int) -> None:
            nonlocal done, tokens
            i = k
            while time.monotonic() < deadline:
                answer = (await http.post(CHAT, json=body(i))).json()
                tokens += answer["usage"]["completion_tokens"]
                done += 1
                i += server.max_num_seqs

        started = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(server.max_num_seqs)))
        took = time.monotonic() - started
    return {"requests_per_s": done / took, "tokens_per_s": tokens / took}


async def live_client(server: ModelServer, rate: float, seconds: float, max_tokens: int) -> dict[str, Any]:
    """Live requests at ``rate`` per second for ``seconds`` (open loop): their latencies."""
    latencies: list[float] = []
    tokens = 0
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:

        async def one(i: int) -> None:
            nonlocal tokens
            sent = time.monotonic()
            answer = (await http.post(CHAT, json=live_body(i, max_tokens))).json()
            latencies.append(time.monotonic() - sent)
            tokens += answer["usage"]["completion_tokens"]

        started = time.monotonic()
        tasks = []
        for i in range(max(1, round(rate * seconds))):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return {
        "requests": len(latencies),
        "tokens": tokens,
        "p50_s": percentile(latencies, 50),
        "p99_s": percentile(latencies, 99),
        "mean_s": sum(latencies) / len(latencies),
    }


def wait_for(check: Any, timeout_s: float, what: str) -> None:
    if not poll_until(check, timeout_s, interval_s=0.1):
        raise TimeoutError(f"no {what} after {timeout_s:.0f} s")


def during_batch(
    args: Any,
    server: ModelServer,
    client: OpenAI,
    poller: MongoPoller,
    rate: float,
    lines: int,
    work: Path,
) -> dict[str, Any]:
    """One batch of ``lines`` through the stack and the live client beside it, once it flows."""
    path = work / f"batch-{uuid.uuid4().hex[:6]}.jsonl"
    with path.open("w") as out:
        for i in range(lines):
            line = {
                "custom_id": f"b{i}",
                "method": "POST",
                "url": CHAT,
                "body": batch_body(i, args.shared_max_tokens),
            }
            out.write(json.dumps(line) + "\n")
    upload = client.files.create(file=path.open("rb"), purpose="batch")
    batch_id, _ = create_batch(client, upload.id)
    trace = poller.watch(batch_id)
    # Lines flow: a whole wave of the server's sequences has been generated since the batch began.
    start_tokens = generated(server)
    wave = server.max_num_seqs * args.shared_max_tokens
    wait_for(lambda: generated(server) - start_tokens >= wave, 600, "batch lines on the server")
    before, t0 = generated(server), time.monotonic()
    live = asyncio.run(live_client(server, rate, args.shared_seconds, args.live_max_tokens))
    window = time.monotonic() - t0
    batch_tokens = generated(server) - before - live["tokens"]
    ended_early = trace.done()
    client.batches.cancel(batch_id)
    poller.wait(batch_id, 300)
    wait_for(
        lambda: metric_value(f"{server.url}/metrics", "vllm:num_requests_running") == 0, 120, "idle server"
    )
    if ended_early:
        print("  (the batch ended inside the window: raise --shared-batch-lines)", flush=True)
    return {"live": live, "batch_tokens_per_s": batch_tokens / window, "window_s": window}


def run(args: Any) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="batchstream-shared-"))
    server: ModelServer
    if args.engine == "sim":
        model_name = "simulated GPU"
        server = SimServer(SERVED_NAME, args.shared_max_num_seqs, args.sim_speedup, args.shared_max_model_len)
    else:
        model_dir = args.shared_model_dir
        if not Path(model_dir, "config.json").exists():
            raise SystemExit(f"no model at {model_dir} (make bench prepares Gemma 3 270M)")
        model_name = Path(model_dir).name
        extra = ["--dtype", args.shared_dtype, "--max-model-len", str(args.shared_max_model_len)]
        server = VllmServer(
            args.inference_python, model_dir, SERVED_NAME, *extra, max_num_seqs=args.shared_max_num_seqs
        )
    print(f"shared: starting the server ({model_name}, max_num_seqs {server.max_num_seqs}) ...", flush=True)
    server.start()
    results: dict[str, Any] = {"settings": []}
    try:
        alone = asyncio.run(
            saturate(server, lambda i: batch_body(i, args.shared_max_tokens), args.shared_seconds)
        )
        live_capacity = asyncio.run(
            saturate(server, lambda i: live_body(i, args.live_max_tokens), args.shared_seconds / 2)
        )
        rate = args.live_share * live_capacity["requests_per_s"]
        print(
            f"shared: the server alone: {alone['tokens_per_s']:.1f} batch tokens/s at full concurrency; "
            f"{live_capacity['requests_per_s']:.2f} live requests/s; the live client sends {rate:.2f}/s",
            flush=True,
        )
        live_alone = asyncio.run(live_client(server, rate, args.shared_seconds, args.live_max_tokens))
        live_tokens_per_s = live_alone["tokens"] / args.shared_seconds
        spare = max(1e-9, alone["tokens_per_s"] - live_tokens_per_s)
        print(
            f"shared: live alone p50 {live_alone['p50_s']:.3f} s, p99 {live_alone['p99_s']:.3f} s; "
            f"spare capacity {spare:.1f} tokens/s",
            flush=True,
        )
        lines = args.shared_batch_lines or max(
            4 * server.max_num_seqs,
            round(3 * alone["tokens_per_s"] * args.shared_seconds / args.shared_max_tokens),
        )
        spec = ModelSpec.parse_remote(f"{SERVED_NAME}={server.url}/v1")
        base_env = {"BATCHSTREAM_INFERENCE_MAX_NUM_SEQS": str(server.max_num_seqs), **args.env}
        stack = new_stack([spec], **base_env)
        try:
            start_stack(stack)
            client = OpenAI(base_url=stack.base_url, api_key=stack.api_key, max_retries=5, timeout=600)
            poller = MongoPoller(stack)
            try:
                for setting in settings(server.max_num_seqs):
                    stack.stop([spec.component])
                    stack.extra_env = {**base_env, **setting.env}
                    stack.start([spec.component])
                    print(
                        f"shared: {setting.name}: a {lines}-line batch with the live client ...", flush=True
                    )
                    got = during_batch(args, server, client, poller, rate, lines, work)
                    got |= {
                        "setting": setting.name,
                        "p99_ratio": got["live"]["p99_s"] / live_alone["p99_s"],
                        "p50_ratio": got["live"]["p50_s"] / live_alone["p50_s"],
                        "share_of_spare": got["batch_tokens_per_s"] / spare,
                    }
                    results["settings"].append(got)
            finally:
                poller.close()
        finally:
            stack.stop()
    finally:
        server.kill()
    rows = [
        [
            x["setting"],
            x["live"]["p50_s"],
            x["live"]["p99_s"],
            f"{x['p99_ratio']:.2f}x",
            x["batch_tokens_per_s"],
            f"{x['share_of_spare']:.0%}",
        ]
        for x in results["settings"]
    ]
    rows.insert(0, ["live alone", live_alone["p50_s"], live_alone["p99_s"], "1.00x", 0.0, "0%"])
    print(
        table(
            f"shared server ({model_name}, {server.max_num_seqs} sequences; targets: live p99 "
            "<= 1.25x alone, batch >= 60% of spare)",
            ["live traffic", "p50 s", "p99 s", "p99 / alone", "batch tok/s", "of spare"],
            rows,
        )
    )
    default = results["settings"][0]
    ratio, share = default["p99_ratio"], default["share_of_spare"]
    print(f"shared: live p99 {ratio:.2f}x alone, batch {share:.0%} of spare capacity")
    return results | {
        "alone": alone,
        "live_capacity": live_capacity,
        "live_rate_per_s": rate,
        "live_alone": live_alone,
        "spare_tokens_per_s": spare,
        "batch_lines": lines,
        "median_p99_ratio": median(x["p99_ratio"] for x in results["settings"]),
    }
