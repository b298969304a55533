// Progressive enhancement for the dashboard: live run status and live logs. Plain JS, no inline script
// (the Content-Security-Policy forbids it); text is always inserted with textContent, never as HTML.
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
  pre = document.createElement("pre");
  pre.className = "log";
  pre.dataset.logOf = `${jobId}:${stepIndex}`;
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
  source.addEventListener("log", (event) => {
    const line = JSON.parse(event.data);
    const pre = logPre(jobId, line.step_index);
    if (!pre) return;
    if (!cleared) {
      // The stream starts at offset 0: drop what the server rendered so nothing is shown twice.
      document.querySelectorAll(`[data-log-of^="${CSS.escape(jobId + ":")}"]`).forEach((el) => { el.textContent = ""; });
      cleared = true;
    }
    const text = line.text.endsWith("\n") ? line.text : line.text + "\n";
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(document.createTextNode(text));
    if (atBottom) pre.scrollTop = pre.scrollHeight;
    pre.closest("details").open = true;
  });
  source.addEventListener("step", (event) => {
    const step = JSON.parse(event.data);
    logPre(jobId, step.step_index);
    if (step.name) setText("data-step-name-of", `${jobId}:${step.step_index}`, step.name);
    setStatus(`step:${jobId}:${step.step_index}`, step.status);
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
  if (main && main.dataset.page === "run") startRunPage(main);
  if (main && main.dataset.page === "runs") startRunsPage();
});
