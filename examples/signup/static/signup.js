// The sign-up page: a token is fetched when the page opens, the button
// cannot fire twice, and every retry reuses the same token.
const params = new URLSearchParams(location.search);
const user = params.get("user") || "1";
const button = document.getElementById("submit");
const status = document.getElementById("status");

let token = null;      // one per page: fetched at open, reused by retries
let activityId = null;
let submitting = false;

function show(text, state) {
  status.textContent = text;
  status.dataset.state = state;
}

async function open() {
  const headers = { "X-User": user };
  activityId = (await (await fetch("/api/activity", { headers })).json()).activityId;
  token = (await (await fetch("/api/idem-token?activityId=" + activityId, { headers })).json()).token;
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
  for (let attempt = 1; attempt <= 8; attempt++) {
    let res;
    try {
      show(attempt === 1 ? "Submitting…" : "Retrying with the same token…", "sending");
      res = await send();
    } catch (e) {
      // A timeout or a dropped connection: the sign-up may have happened.
      // Retry with the same token; the server replays the first answer.
      await new Promise((r) => setTimeout(r, 500 * attempt));
      continue;
    }
    if (res.status === 409) {
      show("Your sign-up is being processed…", "in-progress");
      await new Promise((r) => setTimeout(r, 1000 * Number(res.headers.get("Retry-After") || 1)));
      continue;
    }
    const data = await res.json();
    if (res.ok && data.ok) {
      show(data.message + (res.headers.get("Idempotent-Replayed") ? " (confirmed)" : ""), data.already ? "already" : "done");
      return; // the button stays disabled: this page's token is spent
    }
    show(data.message || data.detail || "Something went wrong.", "error");
    break;
  }
  if (status.dataset.state === "sending") show("The network is not answering; please try again.", "error");
  submitting = false;
  button.disabled = false;
}

button.addEventListener("click", submit);
open().catch((e) => show("Could not load the page: " + e, "error"));
