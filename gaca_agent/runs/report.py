"""``report.html``: a self-contained page to read trajectories.

Per episode: the task, the outcome, and per step the observation, the response (its
thought and action, or the raw text when it has no action block), whether the action was
well-formed and admissible, a short state key (the first 8 characters: equal keys are
equal states), the reward and the step's NLL. Training reports (``training=True``) add the
step's advantage and step-level weight (GACA's w_t), shown as a colour: blue for a
positive advantage, red for a negative one, stronger for a larger |advantage| x weight. A
legend explains the colours. No scripts or assets from elsewhere; every text is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any, Iterable

from gaca_agent.generate.prompts import parse_response, thought_of

_STYLE = """body{font-family:sans-serif;max-width:80em;margin:1em auto;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;vertical-align:top}
details{margin:.3em 0}summary{cursor:pointer}.won{color:#070}.lost{color:#a00}
pre{white-space:pre-wrap;margin:0;font-size:.85em}.invalid{background:#fee}
code{font-size:.85em}.legend span{display:inline-block;padding:0 .6em;margin-right:.4em}"""


def _colour(adv: float | None, weight: float | None) -> str:
    if adv is None:
        return ""
    alpha = min(1.0, 0.15 + 0.35 * abs(adv) * (weight if weight is not None else 1.0))
    rgb = "40,90,220" if adv >= 0 else "220,50,40"
    return f' style="background:rgba({rgb},{alpha:.2f})"'


def _legend(training: bool) -> str:
    parts = ["<p class='legend'><span class='invalid'>red row</span>the response had no "
             "action block (format) or its action was not admissible"]
    if training:
        parts.append("; action cell <span style='background:rgba(40,90,220,.5)'>blue"
                     "</span>positive advantage, <span style='background:rgba(220,50,40,.5)'>"
                     "red</span>negative; stronger colour = larger |advantage| x weight")
    parts.append(". NLL: the step's mean negative log-likelihood per token (as the run "
                 "configured its span); key: the first 8 characters of the state key.</p>")
    return "".join(parts)


def _summary_table(results: dict[str, Any]) -> str:
    rows = [("episodes", results.get("n")), ("failed", results.get("failed")),
            ("success rate", f"{results.get('success_rate', 0):.3f} "
                             f"(95% CI {results.get('success_ci95', [0, 0])[0]:.3f}-"
                             f"{results.get('success_ci95', [0, 0])[1]:.3f})"),
            ("mean score", f"{results.get('mean_score', 0):.3f}"),
            ("mean steps", f"{results.get('mean_steps', 0):.1f}"),
            ("format-invalid rate", f"{results.get('format_invalid_rate', 0):.3f}"),
            ("action-invalid rate", f"{results.get('action_invalid_rate', 0):.3f}")]
    if results.get("complete") is False:
        rows.append(("note", "interrupted: these are the episodes that finished"))
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>"
                   for k, v in rows)
    types = results.get("per_task_type", {})
    if types:
        body += "<tr><th>per task type</th><td><table>" + "".join(
            f"<tr><td>{escape(t)}</td><td>{b['success_rate']:.3f}</td><td>n={b['n']}</td></tr>"
            for t, b in types.items()) + "</table></td></tr>"
    return f"<table>{body}</table>"


def _response_cell(response: str) -> str:
    action, ok = parse_response(response)
    if not ok:  # no usable action block: show what the model wrote
        return f"<td><pre>{escape(response)}</pre></td>"
    return f"<td><pre>{escape(thought_of(response))}</pre></td>"


def _validity(step: dict[str, Any]) -> str:
    if not step["format_valid"]:
        return "format"
    return "ok" if step["action_valid"] else "inadmissible"


def _episode(record: dict[str, Any], training: bool) -> str:
    cls = "won" if record["won"] else "lost"
    outcome = "failed: " + record["error"][:200] if record["failed"] else (
        "won" if record["won"] else "not won")
    head = (f"<summary><span class='{cls}'>#{record['index']} task {record['task_id']}"
            f" (seed {record['seed']}): {escape(outcome)}, score {record['score']:.2f}, "
            f"{record['steps']} steps</span> - {escape(record['task'][:150])}</summary>")
    cols = ["t", "observation", "thought / raw response", "action", "valid", "key", "reward",
            "NLL"] + (["advantage", "weight"] if training else [])
    rows = ["<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for s in record["trajectory"]:
        adv, weight = s.get("advantage"), s.get("weight")
        invalid = "" if s["action_valid"] and s["format_valid"] else " class='invalid'"
        cells = [f"<td>{s['t']}</td><td><pre>{escape(s['observation'])}</pre></td>",
                 _response_cell(s["response"]),
                 f"<td{_colour(adv, weight) if training else ''}>{escape(s['action'])}</td>",
                 f"<td>{_validity(s)}</td>",
                 f"<td><code>{escape(str(s.get('state_key', ''))[:8])}</code></td>",
                 f"<td>{s['reward']:g}</td><td>{float(s.get('nll', 0.0)):.3f}</td>"]
        if training:
            cells.append(f"<td>{'' if adv is None else f'{adv:+.3f}'}</td>"
                         f"<td>{'' if weight is None else f'{weight:.2f}'}</td>")
        rows.append(f"<tr{invalid}>{''.join(cells)}</tr>")
    return f"<details>{head}<table>{''.join(rows)}</table></details>"


def render_report(results: dict[str, Any], records: Iterable[dict[str, Any]],
                  title: str = "gaca evaluation", training: bool = False) -> str:
    episodes = "".join(_episode(r, training)
                       for r in sorted(records, key=lambda r: r["index"]))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f"<p>env {escape(str(results.get('env')))}, policy "
            f"{escape(str(results.get('policy')))}</p>{_summary_table(results)}"
            f"{_legend(training)}<h2>Episodes</h2>{episodes}</body></html>")
