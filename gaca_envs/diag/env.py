"""``gaca/Diag-*-v0``: small text MDPs whose true advantages are known exactly."""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from gaca_envs.core import Anchor, SimStep, TextEnv, stable_hash
from gaca_envs.diag.mdp import TabularMDP, optimal_policy
from gaca_envs.diag.worlds import LEVELLED, WORLDS

DiagSplit = Literal["train", "test", "all"]
TRAIN_TASKS, TEST_TASKS = 48, 16


@lru_cache(maxsize=512)
def build_world(world: str, index: int, level: int | None = None) -> TabularMDP:
    """The MDP of global task ``index`` of ``world`` (deterministic, cached); ``level`` is
    the difficulty knob of worlds that have one (``pivots``)."""
    if world not in WORLDS:
        raise ValueError(f"unknown diagnostic world {world!r}; valid: {sorted(WORLDS)}")
    return WORLDS[world](index) if level is None else WORLDS[world](index, level=level)


@lru_cache(maxsize=512)
def _optimal(world: str, index: int, level: int | None = None):
    return optimal_policy(build_world(world, index, level))


class DiagEnv(TextEnv):
    """A diagnostic text MDP (one per task) with exact values.

    ## Description
    ``world="corridor"`` (``gaca/Diag-Corridor-v0``): a 12-segment corridor whose routine
    segments offer ``walk forward`` / ``rest`` and whose three pivotal junctions offer two
    coloured doors; only the task's colour leads on. ``world="signs"``
    (``gaca/Diag-Signs-v0``): an 8-segment corridor with two junctions where the agent
    must open the door a sign shows (the same rule on every task; the CPU demo's world).
    ``world="slippery"``
    (``gaca/Diag-Slippery-v0``): a river crossing by a short bridge that can be slipped off
    (stochastic) or a long safe path. ``world="pivots"`` (``gaca/Diag-Pivots-v0``, the
    study's world): ``level`` 1-4 sets the length, the number of pivotal doors (each with a
    sign that points to or warns against a door) and, from level 3, jammed doors.
    ``world="keys"`` (``gaca/Diag-Keys-v0``, the credit study's world): ``level`` k gives 2k
    junctions of six kinds (a lever, a chest, ...), each with its own two actions, one of
    which finds a key (the agent is not told which); a key pays 1 / 2k at once, no action
    ends the episode. See
    ``gaca_envs.diag.worlds`` for the exact rules.

    ## Action Space
    ``Text``; the admissible actions are the current state's (``info``). Others are no-ops.

    ## Observation Space
    ``Text``: a one-line description of the current state.

    ## Starting State
    The MDP's start state. Task ``k`` of the split is a fixed MDP (``train``: global tasks
    0-47, ``test``: 48-63, ``all``: 0-63); ``env.unwrapped.mdp`` is the current task's MDP
    and ``env.unwrapped.state_index`` the current state's index in it.

    ## Rewards
    The MDP's transition reward: 1 on reaching the goal, else 0 (``keys``: 1 / 2k per key).
    An episode is won when it ends having earned 1 in all.

    ## Episode End
    Terminated by a terminal transition (goal, dead end, fall). Truncated by the
    registration's ``max_episode_steps`` (40).

    ## Exact values
    ``gaca_envs.diag.exact_values(env.unwrapped.mdp, policy, gamma)`` gives V, Q and A of
    any tabular policy; ``env.unwrapped.expert_action()`` is an optimal policy's action.

    ## Arguments
    ``world``, ``split``, ``level`` (worlds with a difficulty knob), ``anchor``,
    ``render_mode``.

    ## Version History
    v0: initial version.
    """

    def __init__(self, world: str = "corridor", split: DiagSplit = "train",
                 level: int | None = None, anchor: Anchor = "state",
                 render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode, anchor=anchor)
        if world not in WORLDS:
            raise ValueError(f"unknown diagnostic world {world!r}; valid: {sorted(WORLDS)}")
        if level is not None and world not in LEVELLED:
            raise ValueError(f"world {world!r} has no difficulty level")
        self.level = level
        if level is not None:
            build_world(world, 0, level)  # validates the level
        offsets = {"train": (0, TRAIN_TASKS), "test": (TRAIN_TASKS, TEST_TASKS),
                   "all": (0, TRAIN_TASKS + TEST_TASKS)}
        if split not in offsets:
            raise ValueError(f"split must be one of {sorted(offsets)}, got {split!r}")
        self.world, self.split = world, split
        self._first, self._count = offsets[split]
        self.state_index: int | None = None

    @property
    def num_tasks(self) -> int:
        return self._count

    def mdp_for(self, task_id: int) -> TabularMDP:
        """The MDP of task ``task_id`` of this split."""
        return build_world(self.world, self._first + task_id, self.level)

    @property
    def mdp(self) -> TabularMDP:
        """The current task's MDP (after ``reset``)."""
        if self._task_id is None:
            raise RuntimeError("call reset() first: the MDP depends on the task")
        return self.mdp_for(self._task_id)

    def expert_action(self) -> str | None:
        """The action of an optimal policy (value iteration, gamma 0.95) in this state."""
        if self.state_index is None or self._last is None or self._last.terminated:
            return None
        policy = _optimal(self.world, self._first + self._task_id, self.level)
        s = self.state_index
        return self.mdp.actions[s][int(policy[s].argmax())]

    def _sim_task(self, task_id: int) -> str:
        return self.mdp_for(task_id).task

    def state_keys(self, task_id: int) -> dict[str, int]:
        """The state key of each non-terminal state of task ``task_id`` -> its index in
        ``mdp_for(task_id)`` (to map recorded rows back to the MDP)."""
        mdp = self.mdp_for(task_id)
        return {stable_hash([mdp.name, str(self._first + task_id), name]): s
                for s, name in enumerate(mdp.states)}

    def _sim_reset(self, task_id: int) -> SimStep:
        self.state_index = self.mdp.start
        self._return = 0.0
        return self._sim_at(self.state_index, 0.0, False, False)

    def _sim_step(self, action: str) -> SimStep:
        mdp, s = self.mdp, self.state_index
        assert s is not None
        outs = mdp.outcomes[s][mdp.actions[s].index(action)]
        k = int(self.np_random.choice(len(outs), p=[o.prob for o in outs])) if len(outs) > 1 else 0
        out = outs[k]
        self.state_index = out.next_state
        self._return += out.reward
        # won: the episode ends having earned the world's full return of 1 (every world's
        # is 1, paid at the goal or, in ``keys``, in shares along the way)
        return self._sim_at(out.next_state, out.reward, out.terminal,
                            out.terminal and self._return > 1.0 - 1e-9)

    def _sim_at(self, s: int, reward: float, terminal: bool, won: bool) -> SimStep:
        mdp = self.mdp
        if terminal:
            text = "You made it. The episode is over." if won else "That went wrong. The episode is over."
            actions: tuple[str, ...] = ()
            key = stable_hash([mdp.name, str(self._first + self._task_id), "terminal", str(won)])
        else:
            text, actions = mdp.observations[s], mdp.actions[s]
            key = stable_hash([mdp.name, str(self._first + self._task_id), mdp.states[s]])
        return SimStep(text, tuple(sorted(actions)), key, reward=reward, terminated=terminal,
                       won=won)
