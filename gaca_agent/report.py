"""``report.html``: a self-contained page to read trajectories.

Per episode: the task, the outcome, and per step the observation, the thought, the
action, the reward, and, when the run recorded them, the step's advantage and GACA weight
(shown as a colour: blue for positive advantage, red for negative, stronger for larger
weight). No scripts or assets from elsewhere; every text is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Any, Iterable

from gaca_agent.prompts import thought_of

_STYLE = """body{font-family:sans-serif;max-width:70em;margin:1em auto;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;vertical-align:top}
details{margin:.3em 0}summary{cursor:pointer}.won{color:#070}.lost{color:#a00}
pre{white-space:pre-wrap;margin:0;font-size:.85em}.invalid{background:#fee}"""


def _colour(adv: float | None, weight: float | None) -> str:
    if adv is None:
        return ""
    alpha = min(1.0, 0.15 + 0.35 * abs(adv) * (weight if weight is not None else 1.0))
    rgb = "40,90,220" if adv >= 0 else "220,50,40"
    return f' style="background:rgba({rgb},{alpha:.2f})"'


def _summary_table(results: dict[str, Any]) -> str:
    rows = [("episodes", results.get("n")), ("failed", results.get("failed")),
            ("success rate", f"{results.get('success_rate', 0):.3f} "
                             f"(95% CI {results.get('success_ci95', [0, 0])[0]:.3f}-"
                             f"{results.get('success_ci95', [0, 0])[1]:.3f})"),
            ("mean score", f"{results.get('mean_score', 0):.3f}"),
            ("mean steps", f"{results.get('mean_steps', 0):.1f}"),
            ("format-invalid rate", f"{results.get('format_invalid_rate', 0):.3f}")]
    body = "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>"
                   for k, v in rows)
    types = results.get("per_task_type", {})
    if types:
        body += "<tr><th>per task type</th><td><table>" + "".join(
            f"<tr><td>{escape(t)}</td><td>{b['success_rate']:.3f}</td><td>n={b['n']}</td></tr>"
            for t, b in types.items()) + "</table></td></tr>"
    return f"<table>{body}</table>"


def _episode(record: dict[str, Any]) -> str:
    cls = "won" if record["won"] else "lost"
    outcome = "failed: " + record["error"][:200] if record["failed"] else (
        "won" if record["won"] else "not won")
    head = (f"<summary><span class='{cls}'>#{record['index']} task {record['task_id']}"
            f" (seed {record['seed']}): {escape(outcome)}, score {record['score']:.2f}, "
            f"{record['steps']} steps</span> - {escape(record['task'][:150])}</summary>")
    rows = ["<tr><th>t</th><th>observation</th><th>thought</th><th>action</th>"
            "<th>reward</th><th>advantage</th><th>weight</th></tr>"]
    for s in record["trajectory"]:
        adv, weight = s.get("advantage"), s.get("weight")
        invalid = "" if s["action_valid"] and s["format_valid"] else " class='invalid'"
        rows.append(
            f"<tr{invalid}><td>{s['t']}</td><td><pre>{escape(s['observation'])}</pre></td>"
            f"<td><pre>{escape(thought_of(s['response']))}</pre></td>"
            f"<td{_colour(adv, weight)}>{escape(s['action'])}</td><td>{s['reward']:g}</td>"
            f"<td>{'' if adv is None else f'{adv:+.3f}'}</td>"
            f"<td>{'' if weight is None else f'{weight:.2f}'}</td></tr>")
    return f"<details>{head}<table>{''.join(rows)}</table></details>"


def render_report(results: dict[str, Any], records: Iterable[dict[str, Any]],
                  title: str = "gaca evaluation") -> str:
    episodes = "".join(_episode(r) for r in sorted(records, key=lambda r: r["index"]))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
            f"<p>env {escape(str(results.get('env')))}, policy "
            f"{escape(str(results.get('policy')))}</p>{_summary_table(results)}"
            f"<h2>Episodes</h2>{episodes}</body></html>")
