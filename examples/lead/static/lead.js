// The lead form: the key is made when the form opens; a submission is kept
// in localStorage until the server confirms it, and resent on the online
// event, on an interval, and when the page opens again.
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
    if (res.status === 409) {
      show("Your message is being processed…", "in-progress");
      return; // still pending: the interval sends it again
    }
    const data = await res.json();
    if (res.ok && data.ok) {
      localStorage.removeItem(PENDING); // delivered: nothing left to resend
      show(data.message, "done");
      form.reset();
      formKey = crypto.randomUUID(); // a new form, a new key
      return;
    }
    if (res.status >= 400 && res.status < 500) {
      localStorage.removeItem(PENDING); // refused for good: resending will not help
      show(data.message || data.detail, "error");
      return;
    }
    show("The server had a problem; your message is kept and will be resent.", "pending");
  } catch (e) {
    // Offline, a timeout, a dropped connection: keep it, resend later.
    show("No connection. Your message is kept and will be sent when the network is back.", "pending");
  } finally {
    clearTimeout(timer);
    sending = false;
    button.disabled = false;
  }
}

form.addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (sending) return;
  const data = new FormData(form);
  const p = { key: formKey, lead: { name: data.get("name"), email: data.get("email"), message: data.get("message") } };
  localStorage.setItem(PENDING, JSON.stringify(p)); // kept until confirmed, across reloads
  send(p);
});

function resend() {
  const p = pending();
  if (p && !sending) send(p);
}
window.addEventListener("online", resend);
setInterval(resend, 2000);
if (pending()) {
  show("Resending your earlier message…", "pending");
  resend();
}
