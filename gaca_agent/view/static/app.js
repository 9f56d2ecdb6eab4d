// gaca-view's page. Every text from the files reaches the page as a text node, never as
// markup. Routes: #/ runs; #/run/NAME curves; #/it/NAME/IT groups and steps (IT -1: an
// evaluation); #/audit/NAME/IT anchor audit; #/suite/A/B two evaluations side by side.
"use strict";
const TOKEN = new URLSearchParams(location.search).get("token");
const main = document.getElementById("main");
let timer = null;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

async function api(path, params) {
  const q = new URLSearchParams(params || {});
  if (TOKEN) q.set("token", TOKEN);
  const r = await fetch(`/api/${path}?${q}`);
  const body = await r.json().catch(() => ({error: `HTTP ${r.status}`}));
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

const fmt = (x, d = 3) => (x === null || x === undefined) ? "–" :
  (typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(d)) : String(x));
const enc = encodeURIComponent;
const link = (href, text, cls) => el("a", {href, class: cls}, text);

function show(...nodes) { main.replaceChildren(...nodes.flat().filter(n => n !== null && n !== undefined)); }
function fail(err) { show(el("p", {class: "error", id: "error"}, String(err.message || err))); }

function colour(adv, weight) {
  if (adv === null || adv === undefined) return "#eee";
  const a = Math.max(-1, Math.min(1, adv));
  const alpha = 0.15 + 0.85 * Math.abs(a) * (weight === null || weight === undefined ? 1 :
    Math.min(1, 0.4 + 0.6 * weight));
  return a >= 0 ? `rgba(30,140,60,${alpha})` : `rgba(200,40,40,${alpha})`;
}

// ------------------------------------------------------------------------------ runs
async function runsPage() {
  const runs = await api("runs");
  const evals = runs.filter(r => r.kind === "eval").map(r => r.name);
  const rows = runs.map(r => el("tr", {class: "run-row"},
    el("td", {}, link(r.kind === "run" ? `#/run/${enc(r.name)}` : `#/it/${enc(r.name)}/-1`,
                      r.name, "run-link")),
    el("td", {}, r.kind), el("td", {}, r.env || "–"), el("td", {}, r.estimator || r.policy || "–"),
    el("td", {class: "status"}, r.status), el("td", {}, r.kind === "run" ?
      `${r.iterations} kept / ${fmt(r.planned)}` : fmt(r.episodes)),
    el("td", {}, fmt(r.kind === "run" ? (r.last || {})["rollout/success"] : r.success)),
    el("td", {class: "error"}, r.error || "")));
  const pick = id => el("select", {id}, evals.map(n => el("option", {value: n}, n)));
  const suite = evals.length >= 2 ? el("p", {}, "Compare two evaluations: ", pick("suite-a"),
    " vs ", pick("suite-b"), " ", el("button", {id: "suite-go", on: {click: () => {
      location.hash = `#/suite/${enc(document.getElementById("suite-a").value)}/` +
        enc(document.getElementById("suite-b").value);
    }}}, "compare")) : null;
  show(el("h2", {}, "Runs and evaluations"),
       el("table", {id: "runs-table"}, el("tr", {}, ["name", "kind", "env", "estimator / policy",
         "status", "iterations / episodes", "success", ""].map(h => el("th", {}, h))), rows),
       runs.length ? null : el("p", {class: "note"}, "No run or evaluation under this folder."),
       suite);
}

// ----------------------------------------------------------------------------- a run
const CURVES = [
  ["success", ["rollout/success", "eval/success"]], ["losses", ["losses/policy", "losses/entropy"]],
  ["KL", ["losses/kl"]],
  ["IS ratio", ["train/is_ratio_mean", "train/is_ratio_max", "train/is_truncated_frac",
                "train/is_masked_frac"]],
  ["seconds per phase", ["perf/collect_s", "perf/update_s", "sync/seconds", "perf/iteration_s"]],
  ["staleness (versions behind)", ["async/stale_mean", "async/stale_max", "async/dropped_groups"]],
  ["busy share", ["perf/learner_busy", "perf/server_busy"]],
];
const COLOURS = ["#1a5fb4", "#c01c28", "#26a269", "#e66100"];

function curve(title, metrics, keys) {
  const W = 300, H = 150, P = 28;
  const series = keys.map(k => metrics.filter(m => typeof m[k] === "number" && m.iteration >= 0)
    .map(m => [m.iteration, m[k]])).map((pts, i) => ({key: keys[i], pts})).filter(s => s.pts.length);
  const all = series.flatMap(s => s.pts);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("class", "curve-svg");
  svg.setAttribute("data-points", String(all.length));
  if (all.length) {
    const [x0, x1] = [Math.min(...all.map(p => p[0])), Math.max(...all.map(p => p[0]))];
    let [y0, y1] = [Math.min(...all.map(p => p[1])), Math.max(...all.map(p => p[1]))];
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    const X = x => P + (W - P - 6) * (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0));
    const Y = y => H - P + 6 - (H - P) * (y - y0) / (y1 - y0);
    series.forEach((s, i) => {
      const path = document.createElementNS(svg.namespaceURI, "polyline");
      path.setAttribute("points", s.pts.map(p => `${X(p[0])},${Y(p[1])}`).join(" "));
      path.setAttribute("fill", "none"); path.setAttribute("stroke", COLOURS[i % 4]);
      svg.append(path);
    });
    for (const [y, v] of [[Y(y1), y1], [Y(y0), y0]]) {
      const t = document.createElementNS(svg.namespaceURI, "text");
      t.setAttribute("x", 0); t.setAttribute("y", y + 4); t.setAttribute("font-size", 9);
      t.textContent = fmt(v, 2); svg.append(t);
    }
  }
  return el("div", {class: "curve", id: `curve-${title.replace(/\W+/g, "-")}`},
    el("h4", {}, title), svg, el("div", {class: "note"}, series.length ?
      series.map((s, i) => el("span", {style: `color:${COLOURS[i % 4]}`}, `${s.key} `)) :
      "not logged"));
}

async function runPage(name) {
  const draw = async () => {
    const run = await api("run", {name});
    const its = run.iterations.map(i => el("span", {}, link(`#/it/${enc(name)}/${i}`, `${i}`,
      "it-link"), " "));
    const last = run.metrics.filter(m => m.iteration >= 0).slice(-1)[0] || {};
    show(el("h2", {}, `Run ${name}`),
         el("p", {}, `env ${run.env || "–"} · estimator ${run.estimator || "–"} · model ` +
           `${run.model || "–"} · `, el("b", {id: "run-status"}, run.status),
           ` · ${run.metrics.filter(m => m.iteration >= 0).length} iterations logged`,
           ` (last: ${fmt(last.iteration)})`),
         run.error ? el("p", {class: "error"}, run.error) : null,
         el("div", {class: "curves"}, CURVES.map(([t, keys]) => curve(t, run.metrics, keys))),
         el("h3", {}, "Kept rollouts (iterations)"),
         el("p", {id: "iterations"}, its.length ? its : "none kept (keep_rollouts: false)"));
  };
  await draw();
  timer = setInterval(() => draw().catch(fail), 2000);  // live while gaca-train writes
}

// ------------------------------------------------------------------- an iteration
function stepPanel(name, it, detail) {
  const s = detail.step;
  const field = (k, v) => el("tr", {}, el("th", {}, k), el("td", {}, v));
  const rowsTable = (id, rows, caption) => el("div", {},
    el("h4", {}, `${caption} (${rows.length})`), rows.length ? el("table", {id},
      el("tr", {}, ["trajectory", "t", "action", "advantage", "weight", "reward", "state key",
                    "observation"].map(h => el("th", {}, h))),
      rows.map(r => el("tr", {class: "mate"}, el("td", {}, el("a", {class: "step-link",
        on: {click: () => openStep(name, it, r.traj, r.t)}}, r.traj)), el("td", {}, r.t),
        el("td", {}, r.action), el("td", {}, fmt(r.advantage)), el("td", {}, fmt(r.weight)),
        el("td", {}, fmt(r.reward)), el("td", {}, r.state_key),
        el("td", {}, r.observation.slice(0, 120))))) : el("p", {class: "note"}, "none"));
  return el("div", {class: "panel", id: "step-panel"},
    el("h3", {}, `Trajectory ${detail.traj}, step ${s.t} (group ${detail.group})`),
    el("table", {id: "step-fields"},
      field("prompt / observation", el("pre", {}, s.observation ?? "–")),
      field("admissible actions", (s.admissible_actions || []).join("; ")),
      field("raw response", el("pre", {}, s.response ?? "–")),
      field("parsed action", s.action ?? "–"),
      field("valid", `format ${fmt(s.format_valid)}, action ${fmt(s.action_valid)}`),
      field("reward", `${fmt(s.reward)} (env ${fmt(s.env_reward)}, penalty ${fmt(s.penalty)})`),
      field("state key", `${s.state_key} → ${s.next_state_key}`),
      field("NLL", `${fmt(s.nll)} ${s.nll_spans ? JSON.stringify(s.nll_spans) : ""}`),
      field("advantage", fmt(s.advantage)), field("GACA weight", fmt(s.weight)),
      field("ended", `terminated ${fmt(s.terminated)}, truncated ${fmt(s.truncated)}`)),
    rowsTable("anchor-group", detail.anchor_group, "Anchor group: same task group and state key"),
    rowsTable("text-merges", detail.text_merges,
              "Text anchors would merge in (same observation, other state)"),
    rowsTable("text-splits", detail.text_splits,
              "Text anchors would split off (same state, other observation)"));
}

async function openStep(name, it, traj, t) {
  document.querySelectorAll("td.cell.sel").forEach(c => c.classList.remove("sel"));
  const cell = document.querySelector(`td.cell[data-traj="${CSS.escape(String(traj))}"]` +
                                      `[data-t="${t}"]`);
  if (cell) cell.classList.add("sel");
  const slot = document.getElementById("step-slot");
  try {
    slot.replaceChildren(stepPanel(name, it, await api("step", {name, it, traj, t})));
  } catch (e) { slot.replaceChildren(el("p", {class: "error"}, e.message)); }
}

function groupGrid(name, it, g, advOf, recoloured) {
  // cells are built directly (a big iteration has thousands); one click handler per grid
  const width = Math.max(0, ...g.trajs.map(tr => tr.steps.length));
  const table = el("table", {class: "grid"});
  for (const tr of g.trajs) {
    const row = table.insertRow();
    row.insertCell().textContent = `${tr.traj} ${tr.failed ? "failed" : tr.won ? "won" : "lost"}`;
    if (tr.failed) {
      const c = row.insertCell();
      c.className = "error"; c.colSpan = width || 1; c.textContent = tr.error || "failed";
      continue;
    }
    for (const s of tr.steps) {
      const adv = advOf(tr.traj, s), c = row.insertCell();
      c.className = s.valid ? "cell" : "cell invalid";
      c.dataset.traj = tr.traj; c.dataset.t = s.t;
      c.title = `t=${s.t} ${s.action}: advantage ${fmt(adv)}, weight ${fmt(s.weight)}, ` +
        `reward ${fmt(s.reward)}${s.valid ? "" : " (invalid)"}`;
      c.style.backgroundColor = colour(adv, recoloured ? null : s.weight);
      if (s.reward > 0) c.textContent = "★";
    }
  }
  table.addEventListener("click", e => {
    const c = e.target.closest("td.cell");
    if (c) openStep(name, it, c.dataset.traj, Number(c.dataset.t));
  });
  return el("div", {class: "group", "data-group": g.group},
    el("h4", {}, `Group ${g.group} · task ${fmt(g.task_id)}${g.task_type ? " · " + g.task_type : ""}: `,
      el("span", {class: "note"}, g.task)), table);
}

async function iterationPage(name, it) {
  const [data, estimators] = await Promise.all([api("iteration", {name, it}), api("estimators")]);
  let colourBy = null;  // {estimator, values: Map traj|t -> advantage}
  const advOf = (traj, s) => colourBy ? colourBy.values.get(`${traj}|${s.t}`) : s.advantage;
  const types = [...new Set(data.groups.map(g => g.task_type).filter(Boolean))];
  const typeSel = el("select", {id: "filter-type"}, el("option", {value: ""}, "every task type"),
    types.map(t => el("option", {value: t}, t)));
  const outSel = el("select", {id: "filter-outcome"}, ["", "won", "lost", "failed"].map(o =>
    el("option", {value: o}, o || "every outcome")));
  const grids = el("div", {id: "groups"});
  const drawGrids = () => {
    const keep = tr => !outSel.value || (outSel.value === "failed" ? tr.failed :
      !tr.failed && (outSel.value === "won") === tr.won);
    grids.replaceChildren(...data.groups.filter(g => !typeSel.value || g.task_type === typeSel.value)
      .map(g => ({...g, trajs: g.trajs.filter(keep)})).filter(g => g.trajs.length)
      .map(g => groupGrid(name, it, g, advOf, colourBy !== null)));
  };
  typeSel.addEventListener("change", drawGrids); outSel.addEventListener("change", drawGrids);
  const checks = el("span", {id: "est-choices"}, estimators.map(e => el("label", {},
    el("input", {type: "checkbox", value: e, ...(["grpo", "gigpo", "gaca"].includes(e) ?
      {checked: ""} : {})}), e)));
  const result = el("div", {id: "compare-result"});
  const compare = async () => {
    const est = [...checks.querySelectorAll("input:checked")].map(c => c.value);
    result.replaceChildren(el("p", {class: "note"}, `re-scoring with ${est.join(", ")}…`));
    try {
      const c = await api("compare", {name, it, est: est.join(",")});
      result.replaceChildren(compareView(name, it, c, (e) => {
        colourBy = e ? {estimator: e, values: new Map(c.rows.map(r => [`${r.traj}|${r.t}`, r[e]]))}
          : null;
        drawGrids();
      }));
    } catch (e) { result.replaceChildren(el("p", {class: "error"}, e.message)); }
  };
  drawGrids();
  const title = it === -1 ? `Evaluation ${name}` : `Run ${name}, iteration ${it}`;
  show(el("h2", {}, title),
       el("p", {}, it === -1 ? null : link(`#/run/${enc(name)}`, "← the run's curves"), " ",
          link(`#/audit/${enc(name)}/${it}`, "anchor audit", "audit-link")),
       el("div", {class: "controls"}, "Show ", typeSel, " ", outSel),
       el("div", {class: "controls"}, "Estimators side by side: ", checks,
          el("button", {id: "compare-btn", on: {click: compare}}, "re-score")), result,
       el("p", {class: "note"}, "Cells: one step each, green positive, red negative advantage " +
          "(paler: lower GACA weight), ★ a positive reward, hatched an invalid response. Click a step."),
       el("div", {class: "split"}, grids, el("div", {id: "step-slot"})));
  const want = new URLSearchParams(location.hash.split("?")[1] || "").get("step");
  if (want) { const [traj, t] = want.split(":"); openStep(name, it, traj, Number(t)); }
}

function compareView(name, it, c, recolour) {
  const est = c.estimators;
  const sel = el("select", {id: "colour-by", on: {change: e => recolour(e.target.value)}},
    el("option", {value: ""}, "stored advantage"), est.map(e => el("option", {value: e}, e)));
  return el("div", {class: "panel"},
    el("table", {id: "compare-summary"}, el("tr", {}, ["estimator", "mean", "std", "share > 0",
      ...(c.has_exact ? ["corr. with exact", "MSE to exact"] : [])].map(h => el("th", {}, h))),
      est.map(e => { const s = c.summary[e]; return el("tr", {}, el("td", {}, e),
        el("td", {}, fmt(s.mean)), el("td", {}, fmt(s.std)), el("td", {}, fmt(s.positive)),
        ...(c.has_exact ? [el("td", {}, fmt(s.exact_corr)), el("td", {}, fmt(s.exact_mse))] : []));
      })),
    el("p", {}, "Spearman: ", Object.entries(c.spearman).map(([k, v]) => `${k} ${fmt(v)}`)
      .join(" · ")),
    el("p", {}, "Colour the steps by ", sel),
    el("h4", {}, `Steps ${est[0]} and ${est[1]} rank most differently`),
    el("table", {id: "disagreements"}, el("tr", {}, ["trajectory", "t", "action", ...est,
      ...(c.has_exact ? ["exact"] : []), "rank gap"].map(h => el("th", {}, h))),
      c.disagreements.map(r => el("tr", {}, el("td", {}, el("a", {class: "step-link",
        on: {click: () => openStep(name, it, r.traj, r.t)}}, r.traj)), el("td", {}, r.t),
        el("td", {}, r.action), est.map(e => el("td", {}, fmt(r[e]))),
        c.has_exact ? el("td", {}, fmt(r.exact)) : null, el("td", {}, fmt(r.rank_gap, 0))))));
}

// -------------------------------------------------------------------- audit and suite
async function auditPage(name, it) {
  const a = await api("audit", {name, it});
  const list = (id, items, head) => el("table", {id}, el("tr", {}, ["group", head, "rows"]
    .map(h => el("th", {}, h))), items.map(x => el("tr", {}, el("td", {}, x.group),
      el("td", {}, el("pre", {}, x.observation ?? x.texts.join("\n---\n"))),
      el("td", {}, x.rows.map(r => el("span", {}, link(`#/it/${enc(name)}/${it}?step=` +
        `${enc(r.traj)}:${r.t}`, `${r.traj}:${r.t}`, "audit-step"), ` (${r.state_key}) `))))));
  show(el("h2", {}, `Anchor audit of ${name}${it === -1 ? "" : ", iteration " + it}`),
       el("p", {}, `${a.rows} step rows; ${a.text_groups} text-anchor groups; ${a.states} ` +
          "canonical states (within task groups)."),
       el("h3", {}, `Aliased: one observation text, several states (${a.aliased_total})`),
       list("aliased", a.aliased, "observation"),
       el("h3", {}, `Split: one state, several observation texts (${a.split_total})`),
       list("split", a.split, "texts"));
}

async function suitePage(a, b) {
  const s = await api("suite", {a, b});
  const cell = x => x.n ? `${fmt(x.success)} [${fmt(x.ci[0], 2)}, ${fmt(x.ci[1], 2)}] ` +
    `(${x.won}/${x.n})` : "–";
  show(el("h2", {}, "Two evaluations"), el("table", {id: "suite-table"},
    el("tr", {}, el("th", {}, "task type"), el("th", {}, a), el("th", {}, b)),
    s.rows.map(r => el("tr", {}, el("td", {}, r.task_type), el("td", {}, cell(r.a)),
                       el("td", {}, cell(r.b))))),
    el("p", {class: "note"}, "success [95% Wilson interval] (won/episodes)"));
}

async function route() {
  clearInterval(timer);
  const [path] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  document.getElementById("where").textContent = parts.length ? ` / ${parts.join(" / ")}` : "";
  try {
    if (!parts.length) await runsPage();
    else if (parts[0] === "run") await runPage(parts[1]);
    else if (parts[0] === "it") await iterationPage(parts[1], Number(parts[2]));
    else if (parts[0] === "audit") await auditPage(parts[1], Number(parts[2]));
    else if (parts[0] === "suite") await suitePage(parts[1], parts[2]);
    else fail(new Error(`no such page: ${path}`));
  } catch (e) { fail(e); }
}
window.addEventListener("hashchange", route);
route();
