"""The prefix benchmark's input: the generated shared-prefix workloads (documents x questions,
few-shot templates x inputs), a given file, and the same lines grouped by their messages."""

from __future__ import annotations

import json
import random
from pathlib import Path

SERVED_NAME = "prefix-model"
WORDS = "river stone lamp market clock storm bread field letter window garden tower".split()


def documents_lines(documents: int, questions: int, doc_words: int, max_tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for d in range(documents):
        text = " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(doc_words))
        for q in range(questions):
            lines.append(
                _chat(
                    f"doc{d}-q{q}",
                    [
                        {"role": "system", "content": "Answer the question from the document, briefly."},
                        {
                            "role": "user",
                            "content": f"Document {d}:\n{text}\n\nQuestion {q}: what is word {q}?",
                        },
                    ],
                    max_tokens,
                )
            )
    rng.shuffle(lines)
    return lines


def fewshot_lines(templates: int, inputs: int, shots: int, max_tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed + 1)
    lines = []
    for t in range(templates):
        examples = []
        for s in range(shots):
            words = " ".join(rng.choice(WORDS) for _ in range(24))
            examples += [
                {"role": "user", "content": f"Task {t} example {s}: {words}"},
                {"role": "assistant", "content": f"Label {rng.randrange(5)}"},
            ]
        for i in range(inputs):
            words = " ".join(rng.choice(WORDS) for _ in range(12))
            messages = [{"role": "system", "content": f"Label each text for task {t}."}, *examples]
            messages.append({"role": "user", "content": f"Input {i}: {words}"})
            lines.append(_chat(f"tpl{t}-in{i}", messages, max_tokens))
    rng.shuffle(lines)
    return lines


def _chat(custom_id: str, messages: list[dict[str, str]], max_tokens: int) -> str:
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def given_lines(path: str) -> list[str]:
    lines = []
    for raw in Path(path).read_text().splitlines():
        if raw.strip():
            item = json.loads(raw)
            item.setdefault("body", {})["model"] = SERVED_NAME
            lines.append(json.dumps(item))
    return lines


def grouped(input_path: Path, work: Path) -> Path:
    """The same lines sorted by their messages, so lines that share a prefix are adjacent: the
    order a user could give run-batch by hand (the yardstick of what order alone is worth)."""
    lines = [x for x in input_path.read_text().splitlines() if x.strip()]
    lines.sort(key=lambda x: json.dumps(json.loads(x).get("body", {}).get("messages")))
    out = work / "in-grouped.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out
