// replaid playground: plain JavaScript, no build step. Talks to /api/* (see replaid/web/app.py).
"use strict";

const MASK = -1, EMPTY = -2;
const state = { runs: [], limits: {} };

function $(sel, root = document) { return root.querySelector(sel); }
function $all(sel, root = document) { return Array.from(root.querySelectorAll(sel)); }
function esc(s) { return String(s).replace(/[&<>"']/g, c => `&#${c.charCodeAt(0)};`); }  // text into HTML

function showError(msg) {
  const e = $("#error");
  e.textContent = msg;
  e.hidden = !msg;
}

// ---------------------------------------------------------------- a trajectory view
class View {
  constructor(el) {
    this.el = el;
    el.innerHTML = "";
    el.appendChild($("#view-template").content.cloneNode(true));
    this.slider = $(".slider", el);
    this.slider.addEventListener("input", () => { this.follow = +this.slider.value === this.frames.length - 1; this.render(); });
    this.reset();
  }
  reset() {
    this.frames = []; this.vocab = new Map(); this.meta = null; this.follow = true; this.pending = false;
    this.t0 = performance.now();
    $(".tokens", this.el).innerHTML = "";
    $(".finals", this.el).innerHTML = "";
    $(".final-wrap", this.el).hidden = true;
    $(".bar", this.el).style.width = "0";
    this.slider.max = 0; this.slider.value = 0; this.slider.disabled = true;
    $(".step-label", this.el).textContent = "–";
    this.setState("idle", "");
  }
  setState(s, stats) {
    const st = $(".state", this.el);
    st.textContent = s;
    st.dataset.state = s;
    if (stats !== undefined) $(".stats", this.el).textContent = stats;
  }
  learn(tokens) { for (const [k, v] of Object.entries(tokens || {})) this.vocab.set(+k, v); }
  onEvent(ev) {
    if (ev.type === "queued") {
      this.setState(ev.ahead > 0 ? "queued" : "starting", ev.ahead > 0 ? `${ev.ahead} generation(s) ahead of this one on this run` : "");
    } else if (ev.type === "running") {
      this.setState("starting", "loading the first step…");
    } else if (ev.type === "start") {
      this.meta = ev;
      this.learn(ev.tokens);
      const unknown = ev.method === "ar" ? EMPTY : MASK;
      const ids = [], conf = [];
      for (let b = 0; b < ev.B; b++) {  // an edit starts from the given text (pale where it will be re-noised)
        ids.push(ev.ids.map((t, l) => ev.known[l] || ev.mode === "edit" ? t : unknown));
        conf.push(ev.known.map(k => k ? 100 : 0));
      }
      this.frames.push({ i: 0, ids, conf });
      const extra = (ev.mode === "edit" ? ` · strength ${ev.strength}` : "") + (ev.guided ? ` · guidance scale ${ev.guidance_scale}` : "");
      this.setState("running", `${ev.run} (${ev.method}, ${ev.sampler}) · ${ev.mode} · ${ev.steps} steps · length ${ev.L}${extra}`);
      this.schedule();
    } else if (ev.type === "step") {
      this.learn(ev.tokens);
      this.frames.push({ i: ev.i, ids: ev.ids, conf: ev.conf, final: ev.final });
      const m = this.meta;
      $(".bar", this.el).style.width = `${Math.min(100, 100 * ev.i / ev.T).toFixed(1)}%`;
      this.setState("running", `step ${ev.i}/${ev.T} · NFE ${ev.nfe ?? "–"} · ${ev.seconds.toFixed(2)} s` +
        (m ? ` · ${m.run} (${m.method}, ${m.sampler})` : ""));
      this.schedule();
    } else if (ev.type === "done") {
      this.learn(ev.tokens);
      this.done = ev;
      $(".bar", this.el).style.width = "100%";
      const m = this.meta || {};
      const extra = (m.mode === "edit" ? ` · strength ${m.strength}` : "") + (m.guided ? ` · guidance scale ${m.guidance_scale}` : "");
      this.setState("done", `${m.run} (${m.method}, ${m.sampler})${extra} · ${ev.steps} steps · NFE ${ev.nfe} · ${ev.seconds.toFixed(2)} s total · first step after ${ev.first_step_seconds == null ? "–" : ev.first_step_seconds.toFixed(2) + " s"}`);
      const finals = $(".finals", this.el);
      finals.innerHTML = "";
      ev.texts.forEach((t, b) => {
        const d = document.createElement("div");
        d.className = "final";
        d.textContent = t;
        if (ev.required) {  // token guidance: is each required word where it was asked for?
          const r = document.createElement("span");
          r.className = "req";
          r.textContent = `required words: ${ev.required[b].map(x => x ? "✓" : "✗").join(" ")}`;
          d.appendChild(r);
        }
        finals.appendChild(d);
      });
      $(".final-wrap", this.el).hidden = false;
      this.schedule();
    } else if (ev.type === "error") {
      this.fail(ev.message);
    }
  }
  fail(msg) {
    this.setState("error", msg);
    showError(msg);
  }
  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      const n = this.frames.length;
      this.slider.max = Math.max(0, n - 1);
      this.slider.disabled = n < 2;
      if (this.follow) this.slider.value = n - 1;
      this.render();
    });
  }
  render() {
    const k = +this.slider.value, f = this.frames[k];
    if (!f) return;
    const prev = k > 0 ? this.frames[k - 1] : null;
    const T = this.meta ? this.meta.steps : 0;
    const start = this.meta && this.meta.mode === "edit" ? "(the text to edit)" : "(start)";
    $(".step-label", this.el).textContent = k === 0 ? `0 / ${T} ${start}` : f.final ? `${T} / ${T} · final readout` : `${f.i} / ${T}`;
    const known = this.meta ? this.meta.known : [];
    const box = $(".tokens", this.el);
    box.innerHTML = "";
    f.ids.forEach((row, b) => {
      const div = document.createElement("div");
      div.className = "sample";
      if (f.ids.length > 1) div.dataset.label = `#${b + 1}`;
      row.forEach((id, l) => {
        const s = document.createElement("span");
        s.className = "tok";
        const c = f.conf[b][l] / 100;
        if (known[l]) {
          s.classList.add("kept");
          s.textContent = this.vocab.get(id) ?? "?";
        } else if (id === MASK) {
          s.classList.add("mask");
          s.textContent = "▒";
        } else if (id === EMPTY) {
          s.classList.add("empty");
          s.textContent = "·";
        } else {
          let t = this.vocab.get(id) ?? "?";
          if (/^\s*$/.test(t)) t = t.replace(/ /g, "␣") || "∅";
          t = t.replace(/\n/g, "⏎");  // newlines drawn inline: the final text below shows the layout
          s.textContent = t;
          s.style.background = `rgba(31, 95, 191, ${(0.08 + 0.87 * c).toFixed(3)})`;
          s.style.color = c > 0.55 ? "#fff" : "#111";
          if (prev && prev.ids[b][l] !== id) s.classList.add("changed");
        }
        s.title = `position ${l} · token ${id} · p = ${c.toFixed(2)}`;
        div.appendChild(s);
      });
      box.appendChild(div);
    });
  }
}

// ---------------------------------------------------------------- streaming a generation
async function stream(view, payload, url = "/api/generate") {
  view.reset();
  view.setState("sending", "");
  let resp;
  try {
    resp = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(payload) });
  } catch (e) {
    view.fail(`the server did not answer: ${e.message}`);
    return;
  }
  if (!resp.ok) {
    let msg = `HTTP ${resp.status}`;
    try { msg = (await resp.json()).error || msg; } catch (e) { /* not JSON */ }
    view.fail(msg);
    return;
  }
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = block.split("\n").filter(l => l.startsWith("data:")).map(l => l.slice(5)).join("\n");
      if (data) view.onEvent(JSON.parse(data));
    }
  }
  if (!view.done && $(".state", view.el).dataset.state !== "error") view.fail("the stream ended before the generation finished");
}

function formValues(form) {
  const v = {};
  for (const el of $all("input, select, textarea", form)) {
    if (!el.name || el.closest("[hidden]")) continue;
    if (el.dataset.list === "lines") v[el.name] = el.value.split("\n").map(x => x.replace(/\r$/, "")).filter(x => x.trim());
    else v[el.name] = el.type === "number" || el.type === "range" ? Number(el.value) : el.value;
  }
  return v;
}

// ---------------------------------------------------------------- run and sampler selects
function fillSamplers(runSelect) {
  const scope = runSelect.closest("form, .side");
  if (!scope) return;
  const run = state.runs.find(r => r.id === runSelect.value);
  const ss = $(".sampler-select", scope);
  if (!ss || !run) return;
  const keep = ss.value;
  ss.innerHTML = run.samplers.map(s => `<option>${s}</option>`).join("");
  if (run.samplers.includes(keep)) ss.value = keep;
  for (const el of $all(".cont-only", scope)) el.hidden = !run.continuous;
  const cs = $(".classifier-select", scope);
  if (cs) {
    const cl = run.classifiers || [];
    cs.innerHTML = `<option value="">${cl.length ? "none" : "none offered (replaid serve --classifier DIR)"}</option>` +
      cl.map(c => `<option value="${esc(c.id)}">${esc(c.id)}</option>`).join("");
    cs.disabled = !cl.length;
    fillLabels(cs);
  }
}

function fillLabels(cs) {
  const scope = cs.closest("form");
  const run = state.runs.find(r => r.id === $(".run-select", scope).value) || {};
  const c = (run.classifiers || []).find(x => x.id === cs.value);
  const ls = $(".label-select", scope);
  ls.innerHTML = c ? c.labels.map(l => `<option value="${esc(l)}">${esc(l)}</option>`).join("") : "";
  ls.disabled = !c;
}

async function loadRuns() {
  const r = await (await fetch("/api/runs")).json();
  state.runs = r.runs; state.limits = r.limits;
  for (const sel of $all(".run-select")) {
    sel.innerHTML = state.runs.map(x => `<option value="${x.id}">${x.id} (${x.method}, step ${x.step})</option>`).join("");
    sel.addEventListener("change", () => fillSamplers(sel));
  }
  for (const cs of $all(".classifier-select")) cs.addEventListener("change", () => fillLabels(cs));
  // Edit: continuous runs only
  const cont = state.runs.filter(x => x.continuous);
  $("#edit-form .run-select").innerHTML = cont.map(x => `<option value="${x.id}">${x.id} (${x.method}, step ${x.step})</option>`).join("") ||
    `<option value="">no continuous run (editing needs RePlaid or Plaid)</option>`;
  // Compare: the second side defaults to the second run when there is one
  if (state.runs.length > 1) $("#side-b .run-select").value = state.runs[1].id;
  for (const sel of $all(".run-select")) fillSamplers(sel);
  if (state.runs.length === 1) {
    const sb = $("#side-b .sampler-select");
    if (sb.options.length > 1) sb.value = sb.options[1].value;  // one run: compare two samplers
  }
  showRunPage();
}

// ---------------------------------------------------------------- pages
const genView = new View($("#gen-view"));
const editView = new View($("#edit-view"));
const sideViews = { a: new View($("#side-a .output")), b: new View($("#side-b .output")) };

$("#gen-form").addEventListener("submit", ev => {
  ev.preventDefault();
  showError("");
  stream(genView, formValues($("#gen-form")));
});
for (const b of $all("button.example")) {
  b.addEventListener("click", () => { $("#gen-form textarea[name=text]").value = b.dataset.text; });
}
$("#edit-form").addEventListener("submit", ev => {
  ev.preventDefault();
  showError("");
  stream(editView, formValues($("#edit-form")), "/api/edit");
});
const editText = $("#edit-form textarea[name=text]"), editSpans = $("#edit-form input[name=spans]");
function showStrength() { $("#strength-value").textContent = Number($("#edit-form input[name=strength]").value).toFixed(2); }
$("#edit-form input[name=strength]").addEventListener("input", showStrength);
function previewSpans() {  // the text with the spans to re-noise marked (as the server will read them)
  const box = $("#span-preview"), text = editText.value, cuts = [];
  for (const part of editSpans.value.split(",").map(x => x.trim()).filter(Boolean)) {
    const m = /^(\d*):(\d*)$/.exec(part);
    if (!m) { box.textContent = `not a span: ${part}`; return; }
    cuts.push([m[1] ? +m[1] : 0, m[2] ? +m[2] : text.length]);
  }
  box.innerHTML = "";
  if (!cuts.length || !text) return;
  cuts.sort((a, b) => a[0] - b[0]);
  let pos = 0;
  for (const [a, b] of cuts) {
    if (a < pos || b <= a || b > text.length) { box.textContent = "spans overlap or fall outside the text"; return; }
    box.appendChild(document.createTextNode(text.slice(pos, a)));
    const mk = document.createElement("mark"); mk.textContent = text.slice(a, b); box.appendChild(mk);
    pos = b;
  }
  box.appendChild(document.createTextNode(text.slice(pos)));
}
editText.addEventListener("input", previewSpans);
editSpans.addEventListener("input", previewSpans);
$("#add-selection").addEventListener("click", () => {
  const a = editText.selectionStart, b = editText.selectionEnd;
  if (b > a) editSpans.value = (editSpans.value.trim() ? editSpans.value.trim() + "," : "") + `${a}:${b}`;
  previewSpans();
});
$("#clear-spans").addEventListener("click", () => { editSpans.value = ""; previewSpans(); });
$("#cmp-form").addEventListener("submit", ev => {
  ev.preventDefault();
  showError("");
  const shared = formValues($("#cmp-form"));
  for (const side of ["a", "b"]) {
    const own = formValues($(`#side-${side} .controls`));
    stream(sideViews[side], Object.assign({}, shared, own));
  }
});
for (const t of $all("nav .tab")) {
  t.addEventListener("click", () => {
    for (const u of $all("nav .tab")) u.classList.toggle("active", u === t);
    for (const p of $all(".page")) p.hidden = p.id !== t.dataset.tab;
  });
}

async function showRunPage() {
  const sel = $("#run-page-select");
  const box = $("#run-page");
  const resp = await fetch(`/api/runs/${encodeURIComponent(sel.value)}`);
  const info = await resp.json();
  if (!resp.ok) { showError(info.error); return; }
  const run = state.runs.find(r => r.id === info.id) || {};
  const last = info.last_metrics;
  const rows = [["method", run.method], ["preset", run.preset], ["checkpoint step", info.step],
    ["parameters", (run.params || 0).toLocaleString()], ["EMA weights", info.ema ? "yes" : "no"]];
  for (const k of ["loss", "eval/nelbo_nats_per_token", "eval/nelbo_ppl", "eval/unigram_ppl", "eval/nll", "eval/ppl"]) {
    if (typeof last[k] === "number") rows.push([k, +last[k].toPrecision(5)]);
  }
  box.innerHTML = "";
  const table = document.createElement("table");
  for (const [k, v] of rows) {
    const tr = table.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  }
  box.appendChild(table);
  const more = document.createElement("details");
  more.innerHTML = `<summary>last value of every metric (${info.metrics_rows} rows in metrics.jsonl)</summary>`;
  const pre0 = document.createElement("pre");
  pre0.textContent = Object.entries(last).map(([k, v]) => `${k.padEnd(32)} ${typeof v === "number" ? +v.toPrecision(6) : v}`).join("\n");
  more.appendChild(pre0);
  box.appendChild(more);
  const h = document.createElement("h3"); h.textContent = "Training curves (metrics.jsonl)"; box.appendChild(h);
  const img = document.createElement("img"); img.alt = "training curves"; img.className = "curves";
  img.src = `/api/runs/${encodeURIComponent(info.id)}/curves.png?t=${Date.now()}`; box.appendChild(img);
  const h2 = document.createElement("h3");
  h2.textContent = info.figures.length ? "Figures in the run (evaluations and analyses)" : "No figures in the run yet (replaid diagnose / likelihood / sweep write them)";
  box.appendChild(h2);
  const grid = document.createElement("div"); grid.className = "figures";
  for (const f of info.figures) {
    const fig = document.createElement("figure");
    const im = document.createElement("img"); im.src = `/api/runs/${encodeURIComponent(info.id)}/figures/${f.index}`; im.alt = f.name; im.loading = "lazy";
    const cap = document.createElement("figcaption"); cap.textContent = f.name;
    fig.appendChild(im); fig.appendChild(cap); grid.appendChild(fig);
  }
  box.appendChild(grid);
  const h3 = document.createElement("h3"); h3.textContent = "Config"; box.appendChild(h3);
  const pre = document.createElement("pre"); pre.className = "config"; pre.textContent = JSON.stringify(info.config, null, 2); box.appendChild(pre);
}
$("#run-page-select").addEventListener("change", showRunPage);

loadRuns().catch(e => showError(`could not list the runs: ${e.message}`));
