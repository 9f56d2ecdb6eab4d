"""The paper-setting table: a config's choices beside verl-agent's GiGPO scripts (what
``gaca-train --dry-run`` prints)."""

from __future__ import annotations

import yaml

from gaca_agent.config import TrainConfig, to_dict


def setting_rows(config: TrainConfig) -> list[tuple[str, str, str]]:
    """(setting, this config's value, verl-agent's GiGPO value) for every row of the
    paper-setting table (docs/training.md, "Reproducing the papers")."""
    c, env, learner, algo = config, config.env, config.learner, config.algo
    params = algo.params
    webshop = "WebShop" in env.id
    steps = (f"1 epoch x ceil(rows / {learner.mini_batch_rows}) mini-batches"
             if learner.mini_batch_rows else
             f"{learner.ppo_epochs} epoch(s) x {learner.mini_batches} mini-batches")
    anchor = ("exact text of the current observation" if algo.anchor == "observation"
              else "canonical state key")
    if params.get("similarity") is not None:
        anchor += f", similarity >= {params['similarity']}"
    return [
        ("step-level anchor", anchor, "exact text of the current observation, similarity off"),
        ("episode-level mean/std", "over the group's step rows" if params.get(
            "episode_stats") == "steps" else "over the group's trajectories",
         "over the group's step rows"),
        ("success reward", _reward_text(env.reward, env.reward_scale, webshop),
         "10 only when the score is 1" if webshop else "10"),
        ("invalid-action penalty", f"{env.invalid_penalty:g} " + (
            "on the row's scores after discounting" if env.penalty_mode == "row"
            else "added to the step reward"), "-0.1 on the row's scores after discounting"),
        ("invalid means", "missing <think>/<action> tags or a CJK character" if
         env.invalid_definition == "format" else "an inadmissible action",
         "missing <think>/<action> tags or a CJK character"),
        ("optimizer steps per iteration", steps,
         f"1 epoch x ceil(rows / {64 if webshop else 256}) mini-batches"),
        ("PPO clip", f"{learner.clip_low:g}/{learner.clip_high:g}" + (
            f", dual-clip c = {learner.clip_ratio_c:g}" if learner.clip_ratio_c else
            ", no dual-clip"), "0.2/0.2, dual-clip c = 3"),
        ("entropy coefficient, weight decay", f"{learner.entropy_coef:g}, "
                                              f"{learner.weight_decay:g}", "0.001, 0.01"),
        ("normalization", "mean_norm" if params.get("norm") == "mean" else "mean_std_norm",
         "mean_norm" if webshop else "mean_std_norm"),
        ("WebShop data and splits" if webshop else "evaluation split",
         (f"catalogue {env.kwargs.get('catalog') or 'generated'}, train split "
          f"{env.kwargs.get('split')}") if webshop else _eval_split(env.eval_kwargs),
         "items_shuffle_1000.json, train = goals 500+" if webshop else "valid_seen"),
        ("evaluation during training", _eval_text(c),
         "128 episodes, temperature 0.4, every 5 iterations"),
        ("rollouts and weights", _rollout_text(config),
         "vLLM, full fine-tuning (weights synced in process)"),
        ("prompts", f"{env.template_file or 'built-in'} templates (verl-agent's structure: "
                    f"no-history template at step 0), history {env.history_length}",
         "its templates, history 2, no-history template at step 0"),
    ]


def _eval_split(kwargs: dict) -> str:
    """The held-out tasks in a few words: a split's name, or generated games' spec."""
    if "split" in kwargs:
        return str(kwargs["split"])
    made = kwargs.get("generate")
    if isinstance(made, dict):
        return f"{made.get('count')} generated games from seed {made.get('seed')}"
    return "the env's own tasks (no split named)"


def _eval_text(config: TrainConfig) -> str:
    """How often and how: eval_every 0 leaves only the final weights' evaluation."""
    how = (f"{config.env.eval_episodes} episodes, temperature "
           f"{config.model.eval_temperature:g}")
    if not config.eval_every:
        return f"the final weights only (eval_every: 0), {how}"
    return f"{how}, every {config.eval_every} iterations"


def _rollout_text(config: TrainConfig) -> str:
    m, learner = config.model, config.learner
    weights = (f"LoRA r={learner.lora_r}" if learner.lora_r > 0 else "full fine-tuning")
    if m.engine != "server":
        return f"{m.engine} engine in process, {weights}"
    tis = f", TIS cap {learner.tis_cap:g}" if learner.tis_cap is not None else ""
    how = "adapter" if learner.lora_r > 0 else f"weights from disk ({config.server.sync_dtype})"
    where = ", ".join((config.server.base_url, *config.server.replicas))
    servers = "servers" if config.server.replicas else "server"
    return (f"{config.server.kind} {servers} at {where}, {weights}, {how} "
            f"reloaded after each update and probed{tis}")


def _reward_text(reward: str, scale: float, webshop: bool) -> str:
    if reward == "success":
        return f"{scale:g} only when the score is 1" if webshop else f"{scale:g} on success"
    return f"{scale:g} x the score (partial credit)" if webshop else f"{scale:g}"


def describe(config: TrainConfig) -> str:
    """What ``gaca-train --dry-run`` prints: the resolved configuration as YAML, then the
    paper-setting table (this config beside verl-agent's GiGPO setting)."""
    rows = setting_rows(config)
    width = max(len(r[0]) for r in rows)
    table = "\n".join(f"  {name:<{width}}  {ours}\n  {'':<{width}}  (verl-agent: {theirs})"
                      for name, ours, theirs in rows)
    text = (yaml.safe_dump(to_dict(config), sort_keys=False)
            + f"\n# setting ({config.algo.estimator}), against verl-agent's GiGPO scripts:\n"
            + table)
    if config.cluster.backend == "ray":
        from gaca_agent.cluster.fit import placement

        text += "\n\n# placement (cluster.backend: ray), checked against the cluster at start:\n" \
            + "\n".join(f"  {role.line()}" for role in placement(config.cluster,
                                                                  config.env.workers))
    return text
