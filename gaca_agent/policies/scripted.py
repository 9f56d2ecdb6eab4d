"""Policies without a model: random, expert and a person at the terminal."""

from __future__ import annotations

import sys
from typing import Sequence, TextIO

import numpy as np

from gaca_agent.generate.prompts import format_response, parse_response
from gaca_agent.types import ActionOutput, Turn

QUERY_PLACEHOLDER = "<query>"


def _fill(action: str, turn: Turn) -> str:
    # a parametric action (WebShop's search[<query>]) is filled with the task text
    return action.replace(QUERY_PLACEHOLDER, turn.task) if QUERY_PLACEHOLDER in action else action


class RandomPolicy:
    """Uniform over the admissible actions (``search[<query>]`` searches the task text).

    A turn with a sampling key draws from that key (and ``seed``) alone; others from the
    policy's own generator.
    """

    needs_expert = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]:
        out = []
        for turn in turns:
            actions = turn.admissible_actions
            rng = self.rng if turn.key is None else np.random.default_rng([self.seed, turn.key])
            action = _fill(actions[int(rng.integers(len(actions)))], turn) if actions else "look"
            out.append(ActionOutput(format_response(action), action))
        return out


class ExpertPolicy:
    """The environment's ``expert_action()`` (filled in by the collector); with
    ``epsilon`` > 0, a uniformly random admissible action instead with that probability
    (drawn from the turn's key when it has one: the expert mixed with random actions)."""

    needs_expert = True

    def __init__(self, epsilon: float = 0.0, seed: int = 0) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.epsilon, self.seed = epsilon, seed
        self.rng = np.random.default_rng(seed)

    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]:
        out = []
        for turn in turns:
            action = turn.expert_action or ""
            if self.epsilon > 0 and turn.admissible_actions:
                rng = self.rng if turn.key is None else np.random.default_rng(
                    [self.seed, turn.key, 1])
                if rng.random() < self.epsilon:
                    actions = turn.admissible_actions
                    action = _fill(actions[int(rng.integers(len(actions)))], turn)
            out.append(ActionOutput(format_response(action), action,
                                    format_valid=bool(action)))
        return out


class HumanPolicy:
    """A person types each action (a number picks an admissible one)."""

    needs_expert = False

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self.stdin, self.stdout = stdin or sys.stdin, stdout or sys.stdout

    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]:
        out = []
        for turn in turns:
            print(f"\n[{turn.env_id} step {turn.step + 1}] {turn.task}\n{turn.observation}",
                  file=self.stdout)
            for i, a in enumerate(turn.admissible_actions, 1):
                print(f"  {i:3d}. {a}", file=self.stdout)
            self.stdout.write("> ")
            self.stdout.flush()
            line = self.stdin.readline().strip()
            if line.isdigit() and 1 <= int(line) <= len(turn.admissible_actions):
                line = _fill(turn.admissible_actions[int(line) - 1], turn)
            if "<action>" in line:
                action, valid = parse_response(line)
                out.append(ActionOutput(line, action, valid))
            else:
                out.append(ActionOutput(format_response(line), line, bool(line)))
        return out
