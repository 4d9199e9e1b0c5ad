"""Write a compose override that runs one inference worker per GPU, each on its own device id.

``docker compose up --scale inference=N`` cannot do this: every replica of one service gets the
same device reservation, so all N would load onto the same GPU. This copies the resolved
``inference`` service (GPU 0) to ``inference-gpu1`` .. ``inference-gpu<N-1>``, each reserving
its own device id. Standard library only; reads ``docker compose config --format json``::

    docker compose config --format json | python3 deploy/compose_gpus.py 4 > compose.gpus.json
    docker compose -f docker-compose.yml -f compose.gpus.json up -d

(JSON is YAML, so compose reads the file as it is.) Regenerate after changing .env.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from typing import Any

SERVICE = "inference"


def gpu_services(config: dict[str, Any], gpus: int) -> dict[str, Any]:
    """The override document: one copy of ``inference`` per extra GPU (1..gpus-1)."""
    if gpus < 1:
        raise ValueError("need at least one GPU")
    base = config["services"][SERVICE]
    services: dict[str, Any] = {}
    for gpu in range(1, gpus):
        service = copy.deepcopy(base)
        service.pop("build", None)  # the image is built once, by the base service
        service.pop("container_name", None)
        for device in service["deploy"]["resources"]["reservations"]["devices"]:
            device.pop("count", None)
            device["device_ids"] = [str(gpu)]
        services[f"{SERVICE}-gpu{gpu}"] = service
    return {"services": services}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("gpus", type=int, help="number of GPUs on this host (workers to run)")
    args = parser.parse_args(argv)
    json.dump(gpu_services(json.load(sys.stdin), args.gpus), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
