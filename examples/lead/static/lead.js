// The lead form: the key is made when the form opens; the form is checked
// before anything is sent; a submission is kept in localStorage until the
// server gives a definite answer, and resent (with its key) a second after a
// failure, every few seconds, when the network comes back, and when the
// page opens again. While one is pending the form is locked, so it can be
// neither overwritten nor sent a second time under another key. Requests go
// through request() of /kit/panel.js, which shows them in the panel.
import { request, whenOnline, isOffline, showRows, OfflineError } from "/kit/panel.js";

const PENDING = "lead-pending";
const EMAIL = /^[^\s@]+@[^\s@]+\.[^\s@]+$/; // loose, as the server's: name@domain.tld
const form = document.getElementById("lead");
const button = document.getElementById("submit");
const status = document.getElementById("status");
const sent = document.getElementById("sent");

let formKey = crypto.randomUUID(); // made at form open, not at click
let sending = false;

function show(text, state) {
  status.textContent = text;
  status.dataset.state = state;
}

// The checks made before sending: each returns the message to show, or "".
const checks = {
  name: (v) => (v.trim() ? "" : "Please tell us your name."),
  email: (v) =>
    !v.trim() ? "Please give an e-mail address we can reply to."
      : EMAIL.test(v.trim()) ? "" : "This does not look like an e-mail address (name@example.com).",
};

// check shows or clears the message of one field, and reports whether it
// is valid.
function check(name) {
  const input = form.elements[name];
  const message = checks[name](input.value);
  const error = document.getElementById(name + "-error");
  error.textContent = message;
  error.hidden = !message;
  input.setAttribute("aria-invalid", String(Boolean(message)));
  return !message;
}

// validate checks every field, and moves the focus to the first wrong one.
function validate() {
  const wrong = Object.keys(checks).filter((name) => !check(name));
  if (wrong.length) form.elements[wrong[0]].focus();
  return wrong.length === 0;
}

// Fields are checked when the form is sent, and a field that shows a
// message is checked again as it is typed in, so that the message goes as
// soon as it is fixed. (Not when a field is left: a message appearing then
// moves the button away from a click that is under way.)
form.addEventListener("input", (ev) => {
  if (checks[ev.target.name] && ev.target.getAttribute("aria-invalid") === "true") check(ev.target.name);
});

// kept is the submission this page is sending, also when the browser
// refuses localStorage (private mode, storage full): then it survives
// network trouble, though not a reload.
let kept = null;

function pending() {
  try {
    return JSON.parse(localStorage.getItem(PENDING)) || kept;
  } catch {
    return kept;
  }
}

function lock(locked) {
  for (const el of form.elements) el.disabled = locked;
}

// settle ends a pending submission after a definite answer, and opens a new
// form with a new key.
function settle(p) {
  if (kept && kept.key === p.key) kept = null;
  try {
    const cur = JSON.parse(localStorage.getItem(PENDING));
    if (cur && cur.key === p.key) localStorage.removeItem(PENDING); // never another tab's submission
  } catch {
    // Storage refused: kept was all there was.
  }
  formKey = crypto.randomUUID();
  lock(false);
}

// countRows shows how many leads the database holds under key.
async function countRows(key) {
  try {
    const res = await request("/api/leads/count?key=" + encodeURIComponent(key));
    if (res.ok) showRows((await res.json()).rows);
  } catch {
    // The count is for show; the next answer updates it.
  }
}

// send sends a pending submission once. Without a definite answer it stays
// pending, to be resent with the same key.
async function send(p) {
  if (sending) return;
  sending = true;
  button.disabled = true;
  try {
    show("Sending…", "sending");
    let res;
    try {
      res = await request("/api/leads", {
        method: "POST",
        key: p.key,
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(p.lead),
      });
    } catch (e) {
      // Offline, a timeout, a dropped connection: the lead may well have
      // been stored. Keep it; the resend carries the same key, and the
      // server answers a repeat from its record.
      if (e instanceof OfflineError) {
        show("You are offline. Your message is kept and will be sent when you are back online.", "pending");
      } else {
        show("No connection. Your message is kept and will be sent when the network is back.", "pending");
        setTimeout(resend, 1000);
      }
      return;
    }
    const data = await res.json().catch(() => ({}));
    if (res.status === 409) {
      show("Your message is being processed…", "in-progress");
      return; // still pending: the interval sends it again
    }
    if ([408, 425, 429].includes(res.status) || res.status >= 500) {
      show("The server is busy; your message is kept and will be resent.", "pending");
      return;
    }
    settle(p);
    if (res.ok && data.ok) {
      const replayed = res.headers.get("Idempotent-Replayed") === "true";
      show(data.message + (replayed ? " The first answer was lost on the way; this one is the server's record of it: your message was stored once." : ""), "done");
      showReceipt(p.lead, data.leadId);
    } else {
      // Refused for good: resending will not help.
      show(data.detail || data.message || "The message was refused.", "error");
    }
    await countRows(p.key);
  } finally {
    sending = false;
    if (!pending()) button.disabled = false;
  }
}

// showReceipt replaces the form with what was sent.
function showReceipt(lead, id) {
  document.getElementById("sent-ref").textContent = "#" + id;
  document.getElementById("sent-from").textContent = `${lead.name} <${lead.email}>`;
  document.getElementById("sent-message").textContent = lead.message || "—";
  form.reset();
  form.hidden = true;
  sent.hidden = false;
}

// "Send another message": a new form, with the new key settle made.
document.getElementById("again").addEventListener("click", () => {
  sent.hidden = true;
  form.hidden = false;
  show("", "");
  form.elements.name.focus();
});

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (sending) return;
  const existing = pending();
  if (existing) {
    send(existing); // the locked form resends what is pending
    return;
  }
  if (!validate()) {
    show("Please check the highlighted fields.", "invalid");
    return;
  }
  const data = new FormData(form);
  const p = {
    key: formKey,
    lead: { name: data.get("name").trim(), email: data.get("email").trim(), message: data.get("message") },
  };
  kept = p;
  try {
    localStorage.setItem(PENDING, JSON.stringify(p));
  } catch {
    // Storage full or forbidden: kept still holds it for the resends.
  }
  lock(true);
  send(p);
});

function resend() {
  const p = pending();
  if (p && !sending && !isOffline()) send(p);
}
whenOnline(resend);
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
