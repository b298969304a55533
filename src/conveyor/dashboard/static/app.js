// Progressive enhancement for the dashboard: live run status, live logs and the log viewer's tools. Plain
// JS, no inline script (the Content-Security-Policy forbids it); text is always inserted with textContent
// or as text nodes, never as HTML.
"use strict";

const TERMINAL = new Set(["success", "failed", "cancelled"]);
const API = "/api/v1/admin";

function setStatus(key, status) {
  // classList, not className: the job graph's status labels are SVG elements, and a badge keeps `badge`.
  document.querySelectorAll(`[data-status-of="${CSS.escape(key)}"]`).forEach((el) => {
    el.textContent = status;
    for (const name of Array.from(el.classList)) if (name.startsWith("s-")) el.classList.remove(name);
    el.classList.add(`s-${status}`);
  });
}

function setText(attr, key, text) {
  document.querySelectorAll(`[${attr}="${CSS.escape(key)}"]`).forEach((el) => { el.textContent = text; });
}

function duration(started, finished) {
  if (!started || !finished) return "";
  const s = Math.max(0, (Date.parse(finished) - Date.parse(started)) / 1000);
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.floor(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

async function getJson(path) {
  const answer = await fetch(API + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (answer.status === 401) { window.location.assign("/ui/sign-in?next=" + encodeURIComponent(location.pathname)); return null; }
  if (!answer.ok) return null;
  return answer.json();
}

// -- log lines: ANSI colours --------------------------------------------------------------------------
// A port of conveyor/dashboard/ansi.py for streamed lines; both are checked against the same vectors
// (tests/unit/dashboard/ansi_vectors.json), so a live line looks as it does after a reload. It builds
// nodes (text nodes and spans), never HTML.

const ANSI_FLAGS = ["bold", "dim", "italic", "underline", "strike"];
const ANSI_SET_FLAG = { 1: "bold", 2: "dim", 3: "italic", 4: "underline", 9: "strike" };
const ANSI_CLEAR_FLAGS = { 22: ["bold", "dim"], 23: ["italic"], 24: ["underline"], 29: ["strike"] };
const ANSI_CUBE = [0, 95, 135, 175, 215, 255];
const ANSI_PLAIN = Object.freeze({ bold: false, dim: false, italic: false, underline: false, strike: false, fg: null, bg: null });
const ESC = "\x1b", CSI_C1 = "\x9b", OSC_C1 = "\x9d", BEL = "\x07";

function ansiHex(red, green, blue) {
  return "#" + [red, green, blue].map((v) => v.toString(16).padStart(2, "0")).join("");
}

function ansiIndexed(index) {
  if (index < 16) return index;
  if (index < 232) {
    const cube = index - 16;
    return ansiHex(ANSI_CUBE[Math.floor(cube / 36)], ANSI_CUBE[Math.floor(cube / 6) % 6], ANSI_CUBE[cube % 6]);
  }
  const grey = 8 + 10 * (index - 232);
  return ansiHex(grey, grey, grey);
}

function ansiExtended(values) {  // [colour or null, how many values it used]
  if (!values.length) return [null, 0];
  const mode = values[0];
  if (mode === 5) {
    if (values.length < 2) return [null, values.length];
    const index = values[1];
    return [index !== null && index <= 255 ? ansiIndexed(index) : null, 2];
  }
  if (mode === 2) {
    if (values.length < 4) return [null, values.length];
    const rgb = values.slice(1, 4);
    if (rgb.some((v) => v === null || v > 255)) return [null, 4];
    return [ansiHex(rgb[0], rgb[1], rgb[2]), 4];
  }
  return [null, 1];
}

function ansiSubColour(parts) {
  let values = [];
  for (const part of parts.slice(1)) {
    if (part === "") values.push(null);
    else if (/^[0-9]+$/.test(part)) values.push(parseInt(part, 10));
    else return null;
  }
  if (values.length && values[0] === 2 && values.length === 5) values = [2, ...values.slice(2)];
  const [colour, used] = ansiExtended(values);
  return used === values.length ? colour : null;
}

function ansiWith(style, changes) { return Object.freeze({ ...style, ...changes }); }

function ansiSame(a, b) {
  return ANSI_FLAGS.every((flag) => a[flag] === b[flag]) && a.fg === b.fg && a.bg === b.bg;
}

function applySgr(style, params) {
  if (params === "") return ANSI_PLAIN;
  const values = [];
  const colonGroups = new Map();
  for (const group of params.split(";")) {
    if (group.includes(":")) {
      colonGroups.set(values.length, group.split(":"));
      values.push(null);
    } else if (group === "") values.push(0);
    else if (/^[0-9]+$/.test(group)) values.push(parseInt(group, 10));
    else return style;
  }
  let index = 0;
  while (index < values.length) {
    const code = values[index];
    if (colonGroups.has(index)) {
      const parts = colonGroups.get(index);
      const head = parts[0];
      if (head === "38" || head === "48") {
        const colour = ansiSubColour(parts);
        if (colour !== null) style = ansiWith(style, head === "38" ? { fg: colour } : { bg: colour });
      } else if (head === "4") {
        style = ansiWith(style, { underline: !(parts.length === 2 && parts[1] === "0") });
      }
      index += 1;
      continue;
    }
    index += 1;
    if (code === null) continue;
    if (code === 0) style = ANSI_PLAIN;
    else if (code in ANSI_SET_FLAG) style = ansiWith(style, { [ANSI_SET_FLAG[code]]: true });
    else if (code in ANSI_CLEAR_FLAGS) style = ansiWith(style, Object.fromEntries(ANSI_CLEAR_FLAGS[code].map((f) => [f, false])));
    else if (code >= 30 && code <= 37) style = ansiWith(style, { fg: code - 30 });
    else if (code >= 90 && code <= 97) style = ansiWith(style, { fg: code - 90 + 8 });
    else if (code >= 40 && code <= 47) style = ansiWith(style, { bg: code - 40 });
    else if (code >= 100 && code <= 107) style = ansiWith(style, { bg: code - 100 + 8 });
    else if (code === 39) style = ansiWith(style, { fg: null });
    else if (code === 49) style = ansiWith(style, { bg: null });
    else if (code === 38 || code === 48) {
      const [colour, used] = ansiExtended(values.slice(index));
      index += used;
      if (colour !== null) style = ansiWith(style, code === 38 ? { fg: colour } : { bg: colour });
    }
  }
  return style;
}

function ansiSequenceEnd(text, start) {  // [end, SGR parameters or null]
  const length = text.length;
  const between = (ch, low, high) => ch >= low && ch <= high;
  if (text[start] === CSI_C1 || text.startsWith(ESC + "[", start)) {
    let position = start + (text[start] === CSI_C1 ? 1 : 2);
    const paramsStart = position;
    while (position < length && between(text[position], "\x30", "\x3f")) position += 1;
    const paramsEnd = position;
    while (position < length && between(text[position], "\x20", "\x2f")) position += 1;
    if (position >= length || !between(text[position], "\x40", "\x7e")) return [position, null];
    if (text[position] === "m" && paramsEnd === position) return [position + 1, text.slice(paramsStart, paramsEnd)];
    return [position + 1, null];
  }
  if (text[start] === OSC_C1 || text.startsWith(ESC + "]", start)) {
    let position = start + (text[start] === OSC_C1 ? 1 : 2);
    while (position < length) {
      if (text[position] === BEL) return [position + 1, null];
      if (text.startsWith(ESC + "\\", position)) return [position + 2, null];
      position += 1;
    }
    return [length, null];
  }
  let position = start + 1;
  while (position < length && between(text[position], "\x20", "\x2f")) position += 1;
  if (position < length && between(text[position], "\x30", "\x7e")) position += 1;
  return [position, null];
}

function ansiDroppedControl(ch) {
  const code = ch.charCodeAt(0);
  return (code < 0x20 && ch !== "\t") || code === 0x7f || (code >= 0x80 && code <= 0x9f);
}

// Appends `line` to `parent` as text nodes and spans (classes, data-fg/data-bg), as render_ansi does.
function renderAnsiInto(parent, line) {
  line = line.replace(/\r+$/, "");
  let pieces = [];
  let style = ANSI_PLAIN;
  let text = "";
  const flush = () => {
    if (!text) return;
    const last = pieces[pieces.length - 1];
    if (last && ansiSame(last[0], style)) last[1] += text;
    else pieces.push([style, text]);
    text = "";
  };
  let position = 0;
  while (position < line.length) {
    const ch = line[position];
    if (ch === ESC || ch === CSI_C1 || ch === OSC_C1) {
      const [end, params] = ansiSequenceEnd(line, position);
      if (params !== null) {
        const next = applySgr(style, params);
        if (!ansiSame(next, style)) { flush(); style = next; }
      }
      position = end;
      continue;
    }
    if (ch === "\r") { flush(); pieces = []; }
    else if (!ansiDroppedControl(ch)) text += ch;
    position += 1;
  }
  flush();
  for (const [pieceStyle, pieceText] of pieces) {
    if (ansiSame(pieceStyle, ANSI_PLAIN)) { parent.append(document.createTextNode(pieceText)); continue; }
    const span = document.createElement("span");
    const classes = ANSI_FLAGS.filter((flag) => pieceStyle[flag]).map((flag) => `ansi-${flag}`);
    if (typeof pieceStyle.fg === "number") classes.push(`ansi-fg-${pieceStyle.fg}`);
    if (typeof pieceStyle.bg === "number") classes.push(`ansi-bg-${pieceStyle.bg}`);
    if (classes.length) span.className = classes.join(" ");
    if (typeof pieceStyle.fg === "string") span.setAttribute("data-fg", pieceStyle.fg);
    if (typeof pieceStyle.bg === "string") span.setAttribute("data-bg", pieceStyle.bg);
    span.textContent = pieceText;
    parent.append(span);
  }
}

// 256-colour and truecolour values travel as data attributes: the policy forbids style attributes,
// but setting a property of an element's style from script is allowed. The values are #rrggbb, made
// by the renderer from numbers.
function applyAnsiColours(root) {
  root.querySelectorAll("[data-fg]").forEach((el) => { el.style.color = el.dataset.fg; });
  root.querySelectorAll("[data-bg]").forEach((el) => { el.style.backgroundColor = el.dataset.bg; });
}

// -- log viewer: lines, folds, search, times ---------------------------------------------------------------

const SYS_PREFIX = "[conveyor] ";
const GIT_COMMAND = SYS_PREFIX + "$ git ";

// The markup of templates/log.html's log_line, for a streamed line.
function lineElement(jobId, stepIndex, number, text, ts) {
  const anchor = `log-${jobId}-${stepIndex}-${number}`;
  const line = document.createElement("div");
  line.className = "line";
  line.id = anchor;
  const link = document.createElement("a");
  link.className = "ln";
  link.href = `#${anchor}`;
  link.textContent = String(number);
  line.append(link);
  if (ts) {
    const time = document.createElement("time");
    time.className = "ts";
    time.dateTime = ts;
    time.title = ts;
    time.textContent = ts.slice(11, 23);
    line.append(time);
  }
  const body = document.createElement("span");
  body.className = "tx";
  renderAnsiInto(body, text);
  applyAnsiColours(body);
  line.append(body);
  return line;
}

// Appends a streamed line to a step's log, folding the setup step's git lines as logview.log_blocks does.
function appendLogLine(container, jobId, stepIndex, text, ts) {
  const number = Number(container.dataset.lines || container.querySelectorAll(".line").length) + 1;
  container.dataset.lines = String(number);
  const element = lineElement(jobId, stepIndex, number, text, ts);
  const last = container.lastElementChild;
  let fold = last && last.matches("details.fold") ? last : null;
  if (container.hasAttribute("data-setup") && text.startsWith(GIT_COMMAND)) {
    if (!fold) {
      fold = document.createElement("details");
      fold.className = "fold";
      fold.dataset.fold = "";
      const summary = document.createElement("summary");
      const count = document.createElement("span");
      count.className = "fold-count";
      count.textContent = "0";
      summary.append("git ", count, " lines");
      fold.append(summary);
      container.append(fold);
    }
  } else if (!fold || text.startsWith(SYS_PREFIX)) {
    fold = null;
  }
  if (fold) {
    fold.append(element);
    fold.querySelector(".fold-count").textContent = String(fold.querySelectorAll(".line").length);
  } else {
    container.append(element);
  }
}

function openAround(element) {
  for (let details = element.closest("details"); details; details = details.parentElement && details.parentElement.closest("details")) {
    details.open = true;
  }
}

function showLineOfHash() {
  if (!location.hash) return;
  const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (!target || !target.classList.contains("line")) return;
  openAround(target);
  target.scrollIntoView({ block: "center" });
}

function startLogTools(section) {
  const tools = section.querySelector("[data-log-tools-of]");
  if (!tools) return;
  const input = tools.querySelector("[data-log-search]");
  const hits = tools.querySelector("[data-log-hits]");
  let matches = [];
  let current = -1;
  const search = () => {
    section.querySelectorAll(".log .line.hit").forEach((line) => line.classList.remove("hit", "current"));
    matches = [];
    current = -1;
    const wanted = input.value.toLowerCase();
    if (!wanted) { hits.textContent = ""; return; }
    section.querySelectorAll(".log .line").forEach((line) => {
      const body = line.querySelector(".tx");
      if (body && body.textContent.toLowerCase().includes(wanted)) {
        line.classList.add("hit");
        matches.push(line);
      }
    });
    if (matches.length) go(0);
    else hits.textContent = "no match";
  };
  const go = (index) => {
    if (!matches.length) { search(); return; }
    if (current >= 0) matches[current].classList.remove("current");
    current = (index + matches.length) % matches.length;
    const line = matches[current];
    line.classList.add("current");
    openAround(line);
    line.scrollIntoView({ block: "center" });
    hits.textContent = `${current + 1} / ${matches.length}`;
  };
  input.addEventListener("input", search);
  input.addEventListener("keydown", (event) => {
    if (event.key !== "Enter") return;
    event.preventDefault();
    go(current + (event.shiftKey ? -1 : 1));
  });
  tools.querySelector("[data-log-next]").addEventListener("click", () => go(current + 1));
  tools.querySelector("[data-log-prev]").addEventListener("click", () => go(current - 1));
  const times = tools.querySelector("[data-log-times]");
  const showTimes = () => section.classList.toggle("show-times", times.checked);
  times.addEventListener("change", showTimes);
  showTimes();
}

function startLogViewer() {
  applyAnsiColours(document);
  document.querySelectorAll("section.job").forEach(startLogTools);
  showLineOfHash();
  window.addEventListener("hashchange", showLineOfHash);
}

// -- run detail ----------------------------------------------------------------------------------------

function logPre(jobId, stepIndex) {
  let pre = document.querySelector(`[data-log-of="${CSS.escape(jobId + ":" + stepIndex)}"]`);
  if (pre) return pre;
  const holder = document.querySelector(`[data-steps-of="${CSS.escape(jobId)}"]`);
  if (!holder) return null;
  const details = document.createElement("details");
  details.dataset.step = `${jobId}:${stepIndex}`;
  details.open = true;
  const summary = document.createElement("summary");
  const name = document.createElement("span");
  name.dataset.stepNameOf = `${jobId}:${stepIndex}`;
  name.textContent = `step ${stepIndex}`;
  const badge = document.createElement("span");
  badge.className = "badge s-running";
  badge.dataset.statusOf = `step:${jobId}:${stepIndex}`;
  badge.textContent = "running";
  summary.append(name, " ", badge);
  pre = document.createElement("div");
  pre.className = "log";
  pre.dataset.logOf = `${jobId}:${stepIndex}`;
  // The runner reports its setup (checkout, requirements, rules) as step 0.
  if (Number(stepIndex) === 0) pre.dataset.setup = "";
  details.append(summary, pre);
  holder.append(details);
  return pre;
}

const streams = new Map();

function followJob(runId, jobId) {
  if (streams.has(jobId)) return;
  const url = `${API}/runs/${encodeURIComponent(runId)}/jobs/${encodeURIComponent(jobId)}/logs/stream`;
  const source = new EventSource(url, { withCredentials: true });
  streams.set(jobId, source);
  let cleared = false;
  const clearLogs = () => {
    document.querySelectorAll(`[data-log-of^="${CSS.escape(jobId + ":")}"]`).forEach((el) => {
      el.textContent = "";
      delete el.dataset.lines;
    });
    cleared = true;
  };
  source.addEventListener("log", (event) => {
    const line = JSON.parse(event.data);
    const pre = logPre(jobId, line.step_index);
    if (!pre) return;
    // The stream starts at offset 0: drop what the server rendered so nothing is shown twice.
    if (!cleared) clearLogs();
    const text = line.text.endsWith("\n") ? line.text.slice(0, -1) : line.text;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    appendLogLine(pre, jobId, line.step_index, text, line.ts);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
    pre.closest("details").open = true;
  });
  source.addEventListener("step", (event) => {
    const step = JSON.parse(event.data);
    logPre(jobId, step.step_index);
    if (step.name) setText("data-step-name-of", `${jobId}:${step.step_index}`, step.name);
    setStatus(`step:${jobId}:${step.step_index}`, step.status);
  });
  source.addEventListener("attempt", () => {
    // Another attempt's log is now the job's (it ran again): its lines follow from its start.
    clearLogs();
  });
  source.addEventListener("end", (event) => {
    const end = JSON.parse(event.data);
    setStatus(`job:${jobId}`, end.status);
    source.close();
  });
  source.addEventListener("denied", () => {
    // The token was revoked or the session ended while the log played: the page goes back to sign-in.
    source.close();
    window.location.reload();
  });
  source.onerror = () => {
    // EventSource reconnects by itself (with Last-Event-ID); a closed stream after `end` stays closed.
  };
}

function applyRun(run) {
  setStatus(`run:${run.id}`, run.status);
  setText("data-duration-of", `run:${run.id}`, duration(run.started_at, run.finished_at));
  setText("data-reason-of", `run:${run.id}`, run.reason || "");
  for (const job of run.jobs || []) {
    setStatus(`job:${job.id}`, job.status);
    setText("data-duration-of", `job:${job.id}`, duration(job.started_at, job.finished_at));
    setText("data-reason-of", `job:${job.id}`, job.reason || "");
    for (const step of job.steps || []) setStatus(`step:${job.id}:${step.step_index}`, step.status);
  }
}

function startRunPage(main) {
  const runId = main.dataset.runId;
  const canReadLogs = main.dataset.canReadLogs === "yes";
  if (TERMINAL.has(main.dataset.runStatus)) return;
  const follow = () => {
    if (!canReadLogs) return;
    document.querySelectorAll("section.job").forEach((section) => {
      const status = document.querySelector(`[data-status-of="${CSS.escape("job:" + section.dataset.jobId)}"]`);
      if (status && !TERMINAL.has(status.textContent)) followJob(runId, section.dataset.jobId);
    });
  };
  follow();
  const poll = async () => {
    const run = await getJson(`/runs/${encodeURIComponent(runId)}`);
    if (run) {
      applyRun(run);
      if (TERMINAL.has(run.status)) {
        main.dataset.runStatus = run.status;
        document.querySelectorAll("[data-while-active]").forEach((el) => el.remove());
        return;
      }
      if ((run.jobs || []).length !== document.querySelectorAll("section.job").length) {
        window.location.reload();  // jobs were added (a matrix expanded): render them server-side
        return;
      }
    }
    window.setTimeout(poll, 1000);
  };
  window.setTimeout(poll, 1000);
}

// -- runs list ---------------------------------------------------------------------------------------------

function startRunsPage() {
  const rows = () => Array.from(document.querySelectorAll("tr[data-run-id]"));
  const active = () => rows().filter((row) => !TERMINAL.has(row.dataset.status));
  if (!active().length) return;
  const poll = async () => {
    const params = new URLSearchParams(location.search);
    const query = new URLSearchParams({ limit: "100" });
    for (const [name, api] of [["workflow", "workflow"], ["status", "status"], ["source", "routing_key"], ["ref", "ref"]]) {
      if (params.get(name)) query.set(api, params.get(name));
    }
    const page = await getJson(`/runs?${query}`);
    if (page) {
      for (const run of page.items) {
        const row = document.querySelector(`tr[data-run-id="${CSS.escape(run.id)}"]`);
        if (!row) continue;
        row.dataset.status = run.status;
        setStatus(`run:${run.id}`, run.status);
        setText("data-duration-of", `run:${run.id}`, duration(run.started_at, run.finished_at));
        setText("data-reason-of", `run:${run.id}`, run.ended_because || "");
      }
    }
    if (active().length) window.setTimeout(poll, 2000);
  };
  window.setTimeout(poll, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  const main = document.querySelector("main");
  if (main && main.dataset.page === "run") { startLogViewer(); startRunPage(main); }
  if (main && main.dataset.page === "runs") startRunsPage();
});
