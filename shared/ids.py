"""Identifiers in OpenAI's style: a prefix and random hex."""

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def file_id() -> str:
    return new_id("file-")


def batch_id() -> str:
    return new_id("batch_")


def batch_request_id() -> str:
    return new_id("batch_req_")
