"""``gaca-play``: a person plays any ``gaca/`` environment in the terminal.

Each turn shows the observation and the admissible actions, numbered. Type a number to
take that action, or any text (it is sent as is; an inadmissible one does nothing; an
empty line is ignored). Lists longer than 60 (ScienceWorld) are only counted; ``:actions``
prints them. Commands: ``:expert`` (take the expert's action, where the env has one),
``:actions``, ``:reset``, ``:quit``. When an episode ends the next one starts (the same task
with ``--task-id``, else a new draw); play goes on until ``:quit`` or end of input.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import gymnasium as gym

import gaca_envs
from gaca_envs.kv import parse_pairs

gym.register_envs(gaca_envs)


#: Longer admissible lists are not printed every turn (``:actions`` prints them).
LIST_LIMIT = 60


def choose(line: str, actions: tuple[str, ...]) -> str:
    """A typed line to an action: a number picks from the list, anything else is text."""
    text = line.strip()
    if text.isdigit() and 1 <= int(text) <= len(actions):
        return actions[int(text) - 1]
    return text


def play(env: gym.Env, seed: int | None, task_id: int | None,
         stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> list[float]:
    """Play episodes until ``:quit`` or end of input; returns the finished episodes'
    returns, in order."""
    def say(text: str = "") -> None:
        print(text, file=stdout, flush=True)

    options = {"task_id": task_id} if task_id is not None else None
    returns: list[float] = []

    def start(first: bool):
        obs, info = env.reset(seed=seed if first else None, options=options)
        say(f"Task {info['task_id']}: {info['task']}")
        return obs, info

    obs, info = start(True)
    total, steps, show = 0.0, 0, True
    while True:
        actions = info["admissible_actions"]
        if show:
            _show(say, obs, actions)
        show = True
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == ":quit":
            say("\nbye")
            return returns
        if not line.strip():  # nothing typed: not a step
            show = False
            continue
        if line.strip() == ":actions" and actions:
            say("\n".join(f"  {i:3d}. {a}" for i, a in enumerate(actions, 1)))
            show = False
            continue
        if line.strip() == ":actions":
            show = False
            continue
        if line.strip() == ":reset":
            obs, info = start(False)
            total, steps = 0.0, 0
            continue
        if line.strip() == ":expert":
            action = _expert(env, say)
            if action is None:
                continue
        else:
            action = choose(line, actions)
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        steps += 1
        if not info["action_valid"]:
            say(f"(not admissible: {action!r})")
        if terminated or truncated:
            outcome = "won" if info["won"] else ("out of steps" if truncated else "lost")
            say(f"\n{obs}\n\nEpisode over after {steps} steps: {outcome}, return {total:g}."
                "\nA new episode starts (:quit to stop).")
            returns.append(total)
            obs, info = start(False)
            total, steps = 0.0, 0


def _expert(env: gym.Env, say) -> str | None:
    """The env's expert action (said), or None (and why)."""
    expert = getattr(env.unwrapped, "expert_action", None)
    action = expert() if expert else None
    say("(no expert action available)" if action is None else f"(expert) {action}")
    return action


def _show(say, obs: str, actions) -> None:
    """An observation and its numbered actions (only a count when there are many)."""
    say(f"\n{obs}\n")
    if len(actions) <= LIST_LIMIT:
        if actions:
            say("\n".join(f"  {i:3d}. {a}" for i, a in enumerate(actions, 1)))
    else:  # ScienceWorld lists hundreds to thousands
        say(f"  ({len(actions)} admissible actions: :actions lists them numbered)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gaca-play", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("env", nargs="?", default="gaca/Diag-Corridor-v0",
                        help="a gaca/ id (default: %(default)s)")
    parser.add_argument("kwargs", nargs="*", help="env kwargs as key=value (split=valid_seen)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--task-id", type=int, default=None)
    parser.add_argument("--list", action="store_true", help="list the gaca/ ids and exit")
    args = parser.parse_args(argv)
    if args.list:
        for spec in gaca_envs.SPECS:
            print(spec.id)
        return 0
    if args.env not in gym.registry:
        parser.error(f"unknown env {args.env!r}; gaca ids: {[s.id for s in gaca_envs.SPECS]}")
    try:
        env = gym.make(args.env, **parse_pairs(args.kwargs, "env kwarg"))
    except (ValueError, TypeError, KeyError, FileNotFoundError) as err:
        parser.error(f"cannot make {args.env}: {err}")
    try:
        play(env, args.seed, args.task_id)
    except KeyboardInterrupt:
        print("\nbye")
    finally:
        env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
