// The run viewer's script (inference/view.py). Data comes from the JSON in #run-data; every piece
// of it is put on the page as text (textContent / createTextNode), never parsed as HTML.
"use strict";
const DATA = JSON.parse(document.getElementById("run-data").textContent);
const RUNS = DATA.runs;
const ROW_HEIGHT = 30;
const MAIN_METRICS = ["em", "f1", "cover_em", "acc", "reward_mean", "answered", "precision",
  "recall", "searches_per_question", "docs_read_per_question", "invalid_per_question",
  "questions"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  return add(node, ...children);
}

// Append children (nested arrays flattened; null, undefined and false skipped; strings as text).
function add(node, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value, digits) {
  if (value === undefined || value === null) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(digits ?? 3);
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function signed(value) { return (value >= 0 ? "+" : "") + fmt(value); }

// ------------------------------------------------------------------ rows: one per question id
const ROWS = (() => {
  const byId = new Map();
  RUNS.forEach((run, r) => run.questions.forEach((q) => {
    if (!byId.has(q.id)) byId.set(q.id, { id: q.id, entries: new Array(RUNS.length).fill(null) });
    byId.get(q.id).entries[r] = q;
  }));
  const rows = [...byId.values()];
  for (const row of rows) {
    const first = row.entries.find((e) => e);
    row.question = first.question;
    row.hay = [row.id, first.question, ...first.golds,
      ...row.entries.map((e) => (e ? (e.answer || "") + " " + e.finish : ""))].join("\n").toLowerCase();
    const ems = row.entries.map((e) => (e && e.metrics ? e.metrics.em : undefined));
    row.disagree = RUNS.length > 1 && ems.some((v) => v !== ems[0]);
  }
  return rows;
})();

const state = { wrong: false, invalid: false, limit: false, disagree: false, finish: "", text: "", shown: ROWS };

function matches(row) {
  const has = (flag) => row.entries.some((e) => e && e.flags[flag]);
  if (state.wrong && !has("wrong")) return false;
  if (state.invalid && !has("invalid")) return false;
  if (state.limit && !has("limit")) return false;
  if (state.disagree && !row.disagree) return false;
  if (state.finish && !row.entries.some((e) => e && e.finish === state.finish)) return false;
  return !state.text || row.hay.includes(state.text);
}

// ------------------------------------------------------------------ the first page
function overview() {
  const box = el("section", { id: "overview" });
  add(box, el("h2", {}, "Runs"));
  const table = el("table", { id: "metrics-table" });
  add(table, el("tr", {}, el("th", {}, "metric"), RUNS.map((r) => el("th", { class: "num" }, r.name))));
  const describe = (r) => [r.kind, r.config.method, r.config.llm, r.config.data].filter((x) => x).join(" · ");
  add(table, el("tr", {}, el("td", {}, "run"), RUNS.map((r) => el("td", {}, describe(r)))));
  for (const key of MAIN_METRICS) {
    if (!RUNS.some((r) => r.metrics && r.metrics[key] !== undefined)) continue;
    add(table, el("tr", {}, el("td", {}, key),
      RUNS.map((r) => el("td", { class: "num" }, fmt(r.metrics ? r.metrics[key] : undefined)))));
  }
  add(table, el("tr", {}, el("td", {}, "finish reasons"), RUNS.map((r) => el("td", {}, finishCounts(r)))));
  add(box, table);
  if (DATA.comparison) add(box, comparisonTable(DATA.comparison));
  return box;
}

function finishCounts(run) {
  const counts = {};
  for (const q of run.questions) counts[q.finish] = (counts[q.finish] || 0) + 1;
  return Object.entries(counts).sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(", ");
}

function comparisonTable(c) {
  const box = el("div", { id: "comparison" });
  add(box, el("h2", {}, `${RUNS[1].name} − ${RUNS[0].name}: paired bootstrap 95% intervals`));
  if (c.error) { add(box, el("p", {}, c.error)); return box; }
  add(box, el("p", { class: "muted" }, `${c.questions_paired} questions in both runs` +
    (c.questions_paired ? `, ${c.both_answered} answered by both` : "") +
    `; ${c.questions_only_in_baseline} only in ${RUNS[0].name}, ${c.questions_only_in_other} only in ` +
    `${RUNS[1].name}. A difference whose interval excludes 0 is marked "differs"; the others are within ` +
    "the noise of this question sample."));
  const table = el("table", { id: "compare-table" });
  add(table, el("tr", {}, ["metric", RUNS[0].name, RUNS[1].name, "difference", "95% interval", ""]
    .map((h) => el("th", {}, h))));
  for (const [name, row] of Object.entries(c.metrics)) {
    add(table, el("tr", {}, el("td", {}, name), el("td", { class: "num" }, fmt(row.before)),
      el("td", { class: "num" }, fmt(row.after)), el("td", { class: "num" }, signed(row.diff)),
      el("td", { class: "num" }, `[${signed(row.lo)}, ${signed(row.hi)}]`),
      el("td", { class: row.significant ? "real" : "muted" }, row.significant ? "differs" : "within noise")));
  }
  add(box, table);
  return box;
}

// ------------------------------------------------------------------ the question table (virtual)
const GRID = `minmax(90px, 1fr) minmax(200px, 4fr) ${RUNS.map(() => "minmax(140px, 2fr)").join(" ")}`;

function filters() {
  const check = (key, label) => el("label", {}, el("input", { type: "checkbox", id: `filter-${key}`,
    onchange: (e) => { state[key] = e.target.checked; refresh(); } }), " " + label);
  const reasons = [...new Set(RUNS.flatMap((r) => r.questions.map((q) => q.finish)))].sort();
  return el("div", { class: "filters" },
    el("input", { type: "search", id: "search", placeholder: "search id, question, answers",
      oninput: (e) => { state.text = e.target.value.trim().toLowerCase(); refresh(); } }),
    check("wrong", "wrong answer"), check("invalid", "invalid actions"), check("limit", "action limit"),
    RUNS.length > 1 ? check("disagree", "runs disagree (EM)") : null,
    el("label", {}, "finish reason ", el("select", { id: "filter-finish",
      onchange: (e) => { state.finish = e.target.value; refresh(); } },
    el("option", { value: "" }, "any"), reasons.map((r) => el("option", { value: r }, r)))),
    el("span", { id: "count", class: "muted" }));
}

function questionList() {
  const box = el("section", { id: "questions" }, el("h2", {}, "Questions"), filters());
  add(box, el("div", { class: "qhead", style: `grid-template-columns: ${GRID}` }, el("span", {}, "id"),
    el("span", {}, "question"), RUNS.map((r) => el("span", {}, `${r.name}: answer`))));
  const list = el("div", { id: "list", onscroll: drawRows });
  add(list, el("div", { id: "list-spacer" }));
  add(box, list);
  return box;
}

function refresh() {
  state.shown = ROWS.filter(matches);
  document.getElementById("count").textContent = `${state.shown.length} of ${ROWS.length} questions`;
  document.getElementById("list-spacer").style.height = `${state.shown.length * ROW_HEIGHT}px`;
  document.getElementById("list").scrollTop = 0;
  drawRows();
}

function answerCell(entry) {
  if (!entry) return el("span", { class: "muted" }, "not in this run");
  const right = entry.flags.wrong === false;
  return el("span", {}, el("span", { class: "tag " + (right ? "ok" : entry.flags.wrong ? "bad" : "") },
    right ? "✓" : entry.flags.wrong ? "✗" : "?"), " ", entry.answer === null ? "(no answer)" : entry.answer,
  entry.flags.limit ? el("span", { class: "tag warn" }, "limit") : null);
}

function drawRows() {
  const list = document.getElementById("list");
  const spacer = document.getElementById("list-spacer");
  const first = Math.max(0, Math.floor(list.scrollTop / ROW_HEIGHT) - 10);
  const last = Math.min(state.shown.length, first + Math.ceil(list.clientHeight / ROW_HEIGHT) + 20);
  const nodes = [];
  for (let i = first; i < last; i++) {
    const row = state.shown[i];
    nodes.push(el("div", { class: "qrow", tabindex: 0, "data-id": row.id,
      style: `top: ${i * ROW_HEIGHT}px; grid-template-columns: ${GRID}`,
      onclick: () => openQuestion(row.id),
      onkeydown: (e) => { if (e.key === "Enter") openQuestion(row.id); } },
    el("span", {}, row.id), el("span", { title: row.question }, row.question), row.entries.map(answerCell)));
  }
  spacer.replaceChildren(...nodes);
}

// ------------------------------------------------------------------ one question
function openQuestion(id) { location.hash = "q=" + encodeURIComponent(id); }

function keyValues(object, digits) {
  return el("table", { class: "kv" }, Object.entries(object || {}).map(([k, v]) =>
    el("tr", {}, el("td", {}, k), el("td", { class: "num" }, fmt(v, digits)))));
}

function candidatesTable(search) {
  const table = el("table", { class: "candidates" });
  add(table, el("tr", {}, ["#", "rank", "score", "title", "id", "marks"].map((h) => el("th", {}, h))));
  for (const [number, rank, score, title, id, positive, distractor, bearing, expanded] of search.candidates) {
    add(table, el("tr", { class: [positive ? "positive" : "", expanded ? "expanded" : ""].join(" ") },
      el("td", { class: "num" }, number), el("td", { class: "num" }, fmt(rank)), el("td", { class: "num" },
        fmt(score, 4)), el("td", {}, title), el("td", {}, id),
      el("td", {}, positive ? el("span", { class: "tag ok" }, "positive") : null,
        distractor ? el("span", { class: "tag warn" }, "injected distractor") : null,
        bearing ? el("span", { class: "tag" }, "answer-bearing") : null,
        expanded ? el("span", { class: "tag" }, "opened") : null)));
  }
  return table;
}

function llmCalls(calls) {
  return (calls || []).map((c) => el("details", {}, el("summary", {}, `LLM call${c.tag ? " (" + c.tag + ")" : ""}` +
    (c.finish ? `, ${c.finish}` : "") + (c.error ? `, error: ${c.error}` : "")),
  c.prompt !== undefined ? [el("h4", {}, "prompt"), el("pre", {}, fmt(c.prompt))] : null,
  el("h4", {}, "output"), el("pre", {}, c.output)));
}

function turnCard(turn, number, entry) {
  const search = turn.search !== undefined ? entry.searches[turn.search] : null;
  const card = el("div", { class: "card turn" + (turn.kind === "invalid" ? " invalid" : "") });
  add(card, el("h4", {}, `${number}. ${turn.kind}`, turn.reason ? el("span", { class: "tag bad" }, turn.reason) :
    null), llmCalls(turn.llm));
  if (turn.event !== undefined) add(card, el("pre", {}, turn.event));
  if (turn.action !== undefined) add(card, el("h4", {}, "action"), el("pre", {}, turn.action));
  if (search && turn.kind === "search") {
    add(card, el("div", {}, "query: ", el("b", {}, search.query)), candidatesTable(search));
  }
  if (search && turn.kind === "expand") add(card, el("div", { class: "muted" }, `expanded: ${
    search.expanded.length ? search.expanded.map((n) => "[" + n + "]").join(" ") : "none"} of search ${turn.search + 1}`));
  if (turn.observation) {
    const snapshot = turn.observation.trimStart().startsWith("<snapshot");
    const label = snapshot ? "candidate previews shown" : search ? "passages shown" : "observation";
    const body = el("pre", {}, turn.observation);
    add(card, turn.kind === "expand" ? [el("h4", {}, label), body] :
      el("details", {}, el("summary", {}, label), body));
  }
  return card;
}

function transcript(entry) {
  const cards = entry.transcript.map((pieces, t) => el("div", { class: "card turn" }, el("h4", {}, `turn ${t + 1}`),
    pieces.map(([source, text]) => [el("div", { class: "muted" }, source === "model" ? "model" : "env / prompt"),
      el("pre", {}, text)])));
  const searches = entry.searches.map((s, i) => el("div", { class: "card" },
    el("h4", {}, `search ${i + 1}: `, el("b", {}, s.query)), candidatesTable(s)));
  return [cards, searches.length ? [el("h3", {}, "searches"), searches] : null];
}

function whyLine(e) {
  const c = e.counts || {};
  const parts = [`finish: ${e.finish}`];
  if (c.positives_shown !== undefined) {
    parts.push(`positives shown ${c.positives_shown}, opened ${c.positives_opened}, missed ${c.positives_missed}`);
  }
  if (c.docs_read !== undefined) parts.push(`documents opened ${c.docs_read}`);
  if (c.n_invalid) parts.push(`invalid actions ${c.n_invalid}`);
  const skipped = (e.searches || []).flatMap((s, i) => s.candidates.filter((row) => row[5] && !row[8])
    .map((row) => `[${row[0]}] ${row[3] || row[4]} (search ${i + 1})`));
  if (skipped.length) parts.push(`positives not opened: ${skipped.join(", ")}`);
  return parts.join(" · ");
}

function entryColumn(run, entry) {
  const col = el("div", { class: "run-col" }, el("h3", {}, run.name));
  if (!entry) return add(col, el("p", { class: "muted" }, "not in this run"));
  add(col, el("p", {}, "answer: ", answerCell(entry)), el("p", { class: "muted why" }, whyLine(entry)),
    el("details", { open: true }, el("summary", {}, "metrics and reward"),
      el("div", { class: "columns", style: "grid-template-columns: 1fr 1fr" },
        keyValues(entry.metrics), keyValues(entry.reward_parts || { total: entry.reward })),
      keyValues(entry.counts, 2)));
  if (entry.method_stats && Object.keys(entry.method_stats).length) {
    add(col, el("details", {}, el("summary", {}, "method stats"), el("pre", {}, fmt(entry.method_stats))));
  }
  add(col, el("h3", {}, "turns"));
  if (entry.transcript) add(col, transcript(entry));
  else add(col, entry.turns.map((t, i) => turnCard(t, i + 1, entry)));
  return col;
}

function questionPage(id) {
  const row = ROWS.find((r) => r.id === id);
  const box = el("section", { id: "detail" }, el("a", { href: "#", class: "back" }, "← all questions"));
  if (!row) return add(box, el("p", {}, `no question ${id} in these runs`));
  const first = row.entries.find((e) => e);
  add(box, el("h2", {}, `${row.id}: `, first.question),
    el("p", {}, "gold answers: ", first.golds.map((g) => el("span", { class: "tag ok" }, g))),
    el("div", { class: "columns", style: `grid-template-columns: repeat(${RUNS.length}, minmax(0, 1fr))` },
      RUNS.map((run, r) => entryColumn(run, row.entries[r]))));
  return box;
}

// ------------------------------------------------------------------ routing
const app = document.getElementById("app");
const home = el("main", { id: "home" }, overview(), questionList());
const detail = el("main", { id: "question" });
add(app, el("header", {}, el("h1", {}, RUNS.map((r) => r.name).join(" vs "))), home, detail);

function route() {
  const match = location.hash.match(/^#q=(.*)$/);
  if (match) {
    let id = match[1];
    try { id = decodeURIComponent(id); } catch (error) { /* a hand-edited address: look it up as typed */ }
    detail.replaceChildren(questionPage(id));
    home.hidden = true;
    detail.hidden = false;
    window.scrollTo(0, 0);
  } else {
    detail.hidden = true;
    home.hidden = false;
    drawRows();
  }
}
window.addEventListener("hashchange", route);
refresh();
route();
