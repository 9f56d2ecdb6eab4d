"""Prompts from turns, and actions from responses.

A prompt has verl-agent's structure (GiGPO's training setting): at step 0, or with no
history shown, a *no-history* template; afterwards a template with the recent history.
Fields (``str.format``): ``task_description``, ``step_count``, ``history_length``,
``action_history``, ``current_step``, ``current_observation``, ``admissible_actions`` and
its WebShop name ``available_actions`` (the same list). Filled as verl-agent fills them:

- ``action_history``: ``[Observation k: '<obs>', Action k: '<action>']`` lines, oldest
  first, joined by newlines (the last ``history_length`` steps);
- admissible actions: ALFWorld/TextWorld and others one per line, ``'a'`` joined by a
  newline and a space, without ``help``; WebShop ``'a',`` one per line, with
  ``search[<your query>]`` for the search box;
- WebShop observations (current and past): the page's pieces after the instruction,
  each quoted, joined by `` [SEP] ``.

Templates: the built-in ones live in ``gaca_agent/generate/templates/`` (``FAMILY.txt``
and ``FAMILY_no_history.txt``, our own words). ``template_file=`` takes a text file
(with-history template; its no-history one beside it as ``NAME_no_history.txt``, else the
same template with an empty history) or one of verl-agent's prompt modules, a ``.py``
file holding ``*_TEMPLATE`` and ``*_TEMPLATE_NO_HIS`` string constants (read, never
executed), which then works unmodified.

A response is expected as ``<think>...</think><action>...</action>``; a response without
an action block is format-invalid, and its raw text is kept. :func:`verl_format_valid` is
verl-agent's stricter check (both tag pairs present, no CJK character).
"""

from __future__ import annotations

import ast
import re
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gaca_agent.types import Turn

TEMPLATE_DIR = Path(__file__).parent / "templates"
FIELDS = ("task_description", "step_count", "history_length", "action_history",
          "current_step", "current_observation", "admissible_actions", "available_actions")
_ACTION_RE = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")
_QUERY = "search[<query>]"


@dataclass(frozen=True)
class Templates:
    """A family's pair of templates: with history, and for step 0 / no history."""

    with_history: str
    no_history: str


def _check(text: str, where: str) -> str:
    """``text`` if it is a template of :data:`FIELDS` (``str.format`` fields, format specs
    allowed) holding ``current_observation``; else a ValueError naming ``where``."""
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
        text.format(**dict.fromkeys(FIELDS, ""))
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"template {where} has a field that is not one of {FIELDS}: "
                         f"{err}") from None
    if "current_observation" not in names:
        raise ValueError(f"template {where} lacks the field 'current_observation'; "
                         f"fields: {FIELDS}")
    return text


@lru_cache(maxsize=32)
def load_templates(path: str) -> Templates:
    """A template pair from a text file (and its ``_no_history`` sibling) or from
    verl-agent's prompt module (a ``.py`` file; constants read with ``ast``)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"template file {path} does not exist")
    if file.suffix == ".py":
        return _module_templates(file)
    with_history = _check(file.read_text(), path)
    sibling = file.with_name(f"{file.stem}_no_history{file.suffix}")
    no_history = _check(sibling.read_text(), str(sibling)) if sibling.is_file() else with_history
    return Templates(with_history, no_history)


def _module_templates(file: Path) -> Templates:
    constants: dict[str, str] = {}
    for node in ast.parse(file.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value
    pairs = [(name, constants[name + "_NO_HIS"]) for name in sorted(constants)
             if name.endswith("_TEMPLATE") and name + "_NO_HIS" in constants]
    if len(pairs) != 1:
        raise ValueError(f"{file} must define exactly one pair of string constants X_TEMPLATE "
                         f"and X_TEMPLATE_NO_HIS (found {[p[0] for p in pairs] or 'none'})")
    name, no_history = pairs[0]
    return Templates(_check(constants[name], f"{file}:{name}"),
                     _check(no_history, f"{file}:{name}_NO_HIS"))


def builtin_templates(family: str) -> Templates:
    return load_templates(str(TEMPLATE_DIR / f"{family}.txt"))


def format_actions(actions: tuple[str, ...], family: str) -> str:
    """The admissible-action list as verl-agent writes it for the family."""
    if family == "webshop":
        shown = ["search[<your query>]" if a == _QUERY else a for a in actions]
        return "\n".join(f"'{a}'," for a in shown)
    return "\n ".join(f"'{a}'" for a in actions if a != "help")


def format_observation(observation: str, task: str, family: str) -> str:
    """WebShop pages lose the instruction header and quote each piece (verl-agent's
    ``format_obs``); other families' observations are unchanged."""
    if family != "webshop":
        return observation
    parts = observation.split(" [SEP] ")
    if task in parts:
        return " [SEP] ".join(f"'{p}'" for p in parts[parts.index(task) + 1:])
    return observation


@dataclass(frozen=True)
class PromptBuilder:
    """Builds the user message of a turn; ``history_length`` past steps are shown."""

    history_length: int = 2
    template_file: str | None = None

    def templates(self, family: str) -> Templates:
        return load_templates(self.template_file) if self.template_file else \
            builtin_templates(family)

    def messages(self, turn: Turn, system_prompt: str | None = None) -> list[dict[str, str]]:
        """The chat messages of a turn: the system prompt (if any), then :meth:`build`."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": self.build(turn)})
        return messages

    def build(self, turn: Turn) -> str:
        family = turn.family
        recent = turn.history[-self.history_length:] if self.history_length > 0 else ()
        first = turn.step - len(recent) + 1
        history = "\n".join(
            f"[Observation {first + i}: '{format_observation(obs, turn.task, family)}', "
            f"Action {first + i}: '{act}']" for i, (obs, act) in enumerate(recent))
        actions = format_actions(turn.admissible_actions, family)
        pair = self.templates(family)
        template = pair.no_history if turn.step == 0 or self.history_length <= 0 \
            else pair.with_history
        return template.format(
            task_description=turn.task, step_count=turn.step, history_length=len(recent),
            action_history=history, current_step=turn.step + 1,
            current_observation=format_observation(turn.observation, turn.task, family),
            admissible_actions=actions, available_actions=actions)


def parse_response(text: str) -> tuple[str, bool]:
    """(action, format_valid): the last ``<action>`` block's text, whitespace-collapsed;
    ``("", False)`` when the response has no non-empty action block."""
    matches = _ACTION_RE.findall(text)
    if not matches:
        return "", False
    action = " ".join(matches[-1].split())
    return action, bool(action)


def verl_format_valid(text: str) -> bool:
    """verl-agent's validity of a response (its ``projection``): an ``<action>`` and an
    ``</action>`` tag, a ``<think>`` and a ``</think>`` tag, and no CJK character; the
    action itself may be anything, admissible or not."""
    lower = text.lower()
    return ("<action>" in lower and "</action>" in lower and "<think>" in text
            and "</think>" in text and not _CJK_RE.search(text))


def thought_of(text: str) -> str:
    match = _THINK_RE.search(text)
    return match.group(1).strip() if match else ""


def format_response(action: str, thought: str = "") -> str:
    """A well-formed response (for scripted policies and format warm-up data)."""
    return f"<think>{thought}</think><action>{action}</action>"
