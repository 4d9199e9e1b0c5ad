"""``python -m tests.chaos --trials 200``: trials spread over every fault, then a summary table.

``--fault NAME --seed N`` replays one trial (each trial prints its seed). Exit status 1 if any
trial lost or duplicated a line, ended wrong or left work in flight.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from tests.chaos.trials import FAULTS, ChaosStack, TrialResult, failed, run_trial, spread, summary


def main(
    trials: Annotated[int, typer.Option(help="Trials in all, spread over the faults in turn.")] = len(FAULTS),
    lines: Annotated[int, typer.Option(help="Lines per batch.")] = 4000,
    fault: Annotated[list[str] | None, typer.Option(help="Only these faults (repeatable).")] = None,
    seed: Annotated[
        int | None, typer.Option(help="With one --fault and --trials 1: replay this seed.")
    ] = None,
    dynamic_membership: Annotated[
        bool, typer.Option(help="The aggregator without a group instance id (as before the fix).")
    ] = False,
    static_workers: Annotated[
        bool,
        typer.Option(
            help="The inference workers as static group members (named after the component, the "
            "second one '<component>-twin'); default: dynamic, as the local stack runs them."
        ),
    ] = False,
) -> None:
    names = fault or list(FAULTS)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise typer.BadParameter(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    master = seed if seed is not None else random.randrange(2**31)
    plan = [(names[0], seed)] if seed is not None and trials == 1 else list(spread(trials, names, master))
    print(f"chaos: {len(plan)} trials, {lines} lines each, plan seed {master}", flush=True)
    results: list[TrialResult] = []
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        chaos = ChaosStack(Path(tmp), static_membership=not dynamic_membership, static_workers=static_workers)
        try:
            chaos.start()
            for name, trial_seed in plan:
                try:
                    results.append(run_trial(chaos, FAULTS[name], trial_seed, lines, log=_say))
                except Exception as exc:  # a hung or broken trial is a failed one; go on
                    _say(f"chaos trial fault={name} seed={trial_seed} lines={lines} FAILED: {exc!r}")
                    results.append(failed(name, trial_seed, lines, repr(exc)))
        finally:
            chaos.close()
            if results:
                print(summary(results), flush=True)
    sys.exit(0 if all(r.ok for r in results) else 1)


def _say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    typer.run(main)
