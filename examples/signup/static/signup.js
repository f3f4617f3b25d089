// The sign-up page: a token is fetched when the page opens, the button
// cannot fire twice, and every retry reuses the same token. A submission in
// flight is kept in localStorage, so a reload resumes it with its token.
const params = new URLSearchParams(location.search);
const user = params.get("user") || "1";
const PENDING = "signup-pending-" + user;
const button = document.getElementById("submit");
const status = document.getElementById("status");

let token = null;      // one per page: fetched at open, reused by retries
let activityId = null;
let submitting = false;

function show(text, state) {
  status.textContent = text;
  status.dataset.state = state;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function savePending() {
  try { localStorage.setItem(PENDING, JSON.stringify({ token, activityId })); } catch { /* storage full: still send */ }
}

function loadPending() {
  try { return JSON.parse(localStorage.getItem(PENDING)); } catch { return null; }
}

async function newToken() {
  const res = await fetch("/api/idem-token?activityId=" + activityId, { headers: { "X-User": user } });
  token = (await res.json()).token;
}

async function open() {
  activityId = (await (await fetch("/api/activity", { headers: { "X-User": user } })).json()).activityId;
  const p = loadPending();
  if (p && p.activityId === activityId && p.token) {
    token = p.token; // a submission that never got its answer: finish it
    show("Finishing your earlier sign-up…", "sending");
    return submit();
  }
  await newToken();
  button.disabled = false;
  show("Ready.", "ready");
}

async function send() {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), 4000);
  try {
    return await fetch("/api/signup", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-User": user, "Idempotency-Key": JSON.stringify(token) },
      body: JSON.stringify({ activityId }),
      signal: ctrl.signal,
    });
  } finally {
    clearTimeout(timer);
  }
}

async function submit() {
  if (submitting || !token) return; // a double click does nothing
  submitting = true;
  button.disabled = true;
  savePending();
  let renewed = false;
  for (let attempt = 1; attempt <= 8; attempt++) {
    let res, data;
    try {
      show(attempt === 1 ? "Submitting…" : "Retrying with the same token…", "sending");
      res = await send();
      data = await res.json().catch(() => ({}));
    } catch (e) {
      // A timeout or a dropped connection: the sign-up may have happened.
      // Retry with the same token; the server replays the first answer.
      await sleep(500 * attempt);
      continue;
    }
    if (res.status === 409 || res.status === 429 || res.status >= 500) {
      // In progress, throttled, or a gateway or server hiccup: same token, later.
      if (res.status === 409) show("Your sign-up is being processed…", "in-progress");
      await sleep(1000 * Number(res.headers.get("Retry-After") || attempt));
      continue;
    }
    if (res.status === 400 && data.code === "token-rejected" && !renewed) {
      // The token expired (or was never valid): it never ran, so a new one is safe.
      renewed = true;
      await newToken();
      savePending();
      continue;
    }
    localStorage.removeItem(PENDING); // a definite answer
    if (res.ok && data.ok) {
      show(data.message + (res.headers.get("Idempotent-Replayed") ? " (confirmed)" : ""), data.already ? "already" : "done");
      return; // the button stays disabled: this page's token is spent
    }
    show(data.message || data.detail || "Something went wrong.", "error");
    submitting = false;
    button.disabled = false;
    return;
  }
  // Still no answer: keep the pending submission (and its token) for later.
  show("The network is not answering; your sign-up will be finished when you try again.", "error");
  submitting = false;
  button.disabled = false;
}

button.addEventListener("click", submit);
open().catch((e) => show("Could not load the page: " + e, "error"));
