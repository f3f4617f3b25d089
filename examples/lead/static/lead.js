// The lead form: the key is made when the form opens; a submission is kept
// in localStorage until the server gives a definite answer, and resent (with
// its key) on the online event, on an interval, and when the page opens
// again. While one is pending the form is locked, so it can be neither
// overwritten nor sent a second time under another key.
const PENDING = "lead-pending";
const form = document.getElementById("lead");
const button = document.getElementById("submit");
const status = document.getElementById("status");

let formKey = crypto.randomUUID(); // made at form open, not at click
let sending = false;

function show(text, state) {
  status.textContent = text;
  status.dataset.state = state;
}

function pending() {
  try { return JSON.parse(localStorage.getItem(PENDING)); } catch { return null; }
}

function lock(locked) {
  for (const el of form.elements) el.disabled = locked;
}

// settle ends a pending submission after a definite answer, and opens a new
// form with a new key.
function settle(p) {
  const cur = pending();
  if (cur && cur.key === p.key) localStorage.removeItem(PENDING); // never another tab's submission
  formKey = crypto.randomUUID();
  lock(false);
}

async function send(p) {
  if (sending) return;
  sending = true;
  button.disabled = true;
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), 5000);
  try {
    show("Sending…", "sending");
    const res = await fetch("/api/leads", {
      method: "POST",
      headers: { "Content-Type": "application/json", "Idempotency-Key": JSON.stringify(p.key) },
      body: JSON.stringify(p.lead),
      signal: ctrl.signal,
    });
    const data = await res.json().catch(() => ({}));
    if (res.status === 409) {
      show("Your message is being processed…", "in-progress");
      return; // still pending: the interval sends it again
    }
    if (res.ok && data.ok) {
      settle(p);
      form.reset();
      show(data.message, "done");
      return;
    }
    if ([408, 425, 429].includes(res.status) || res.status >= 500) {
      show("The server is busy; your message is kept and will be resent.", "pending");
      return;
    }
    settle(p); // refused for good: resending will not help
    show(data.message || data.detail || "The message was refused.", "error");
  } catch (e) {
    // Offline, a timeout, a dropped connection: keep it, resend later.
    show("No connection. Your message is kept and will be sent when the network is back.", "pending");
  } finally {
    clearTimeout(timer);
    sending = false;
    if (!pending()) button.disabled = false;
  }
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (sending) return;
  const existing = pending();
  if (existing) { send(existing); return; } // the locked form resends what is pending
  const data = new FormData(form);
  const p = { key: formKey, lead: { name: data.get("name"), email: data.get("email"), message: data.get("message") } };
  try { localStorage.setItem(PENDING, JSON.stringify(p)); } catch { /* storage full: still send */ }
  lock(true);
  send(p);
});

function resend() {
  const p = pending();
  if (p && !sending) send(p);
}
window.addEventListener("online", resend);
setInterval(resend, 2000);
const p = pending();
if (p) {
  // Reopened with a submission that never got its answer: show it, keep its
  // key, and finish it.
  formKey = p.key;
  for (const [name, value] of Object.entries(p.lead)) {
    if (form.elements[name]) form.elements[name].value = value ?? "";
  }
  lock(true);
  show("Resending your earlier message…", "pending");
  resend();
}
