// The "behind the scenes" panel. The page sends its requests through
// request(), which shows each one in the panel as it goes: method, path,
// Idempotency-Key, HTTP status and Idempotent-Replayed. The panel also has
// the network trouble switches: "drop the next response" (the server
// commits, then cuts the connection without answering) and "go offline"
// (the page sends nothing for a few seconds). The same file serves
// examples/signup and examples/lead; a real page keeps only the fetch.

const DROP_HEADER = "X-Demo-Drop-Response"; // honoured by the example's server

const log = document.getElementById("log");
const dropNext = document.getElementById("drop-next");
const offlineButton = document.getElementById("go-offline");
const offlineLabel = document.getElementById("go-offline-label");
const offlineIcon = document.getElementById("go-offline-icon");
const net = document.getElementById("net");
const rows = document.getElementById("rows");

// OfflineError is thrown by request() while the page is offline: nothing
// was sent.
export class OfflineError extends Error {
  constructor() {
    super("offline: not sent");
    this.name = "OfflineError";
  }
}

let offlineUntil = 0; // while set, request() sends nothing
let offlineTimer = null;
const onlineHandlers = [];

// isOffline reports whether the panel's offline switch is on.
export function isOffline() {
  return offlineUntil > 0;
}

// whenOnline calls fn when the network comes back: the browser's online
// event, and the end of the panel's offline spell.
export function whenOnline(fn) {
  window.addEventListener("online", fn);
  onlineHandlers.push(fn);
}

// offlineSeconds is how long "go offline" lasts: the button's data-seconds.
function offlineSeconds() {
  return Number(offlineButton.dataset.seconds) || 5;
}

function goOffline() {
  offlineUntil = Date.now() + offlineSeconds() * 1000;
  offlineTimer = setInterval(() => (Date.now() >= offlineUntil ? goOnline() : renderNet()), 250);
  renderNet();
}

function goOnline() {
  clearInterval(offlineTimer);
  offlineUntil = 0;
  renderNet();
  for (const fn of onlineHandlers) fn();
}

function renderNet() {
  const left = Math.max(0, Math.ceil((offlineUntil - Date.now()) / 1000));
  net.dataset.offline = String(isOffline());
  net.textContent = isOffline() ? `Offline · ${left} s` : "Online";
  offlineButton.setAttribute("aria-pressed", String(isOffline()));
  offlineLabel.textContent = isOffline() ? "Back online now" : `Go offline for ${offlineSeconds()} s`;
  offlineIcon.textContent = isOffline() ? `${left} s` : "off";
}

offlineButton.addEventListener("click", () => (isOffline() ? goOnline() : goOffline()));
renderNet();

// showRows shows the row count the page asked the server for.
export function showRows(n) {
  const text = n == null ? "–" : String(n);
  if (rows.textContent !== text) {
    rows.textContent = text;
    rows.classList.remove("changed");
    void rows.offsetWidth; // restart the highlight
    rows.classList.add("changed");
  }
  rows.dataset.rows = n == null ? "" : String(n);
}

// request sends one request and logs it in the panel. key, when given, is
// sent as the Idempotency-Key header (a structured-field string: the key in
// double quotes). It throws OfflineError, sending nothing, while the page
// is offline, and fetch's error when no response arrives within timeout
// milliseconds (a timeout, a dropped connection, no network).
export async function request(path, { method = "GET", headers = {}, body, key, timeout = 5000 } = {}) {
  const entry = logRequest(method, path, key);
  if (isOffline()) {
    entry.failed("offline", "Offline: not sent");
    throw new OfflineError();
  }
  headers = { ...headers };
  if (key) headers["Idempotency-Key"] = JSON.stringify(key);
  if (method !== "GET" && dropNext.checked) {
    headers[DROP_HEADER] = "1";
    dropNext.checked = false; // only the next one
    entry.note("↯ the server will drop the answer");
  }
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), timeout);
  try {
    const res = await fetch(path, { method, headers, body, signal: ctrl.signal });
    // A same-origin page sees every response header; a page on another
    // origin needs Access-Control-Expose-Headers: Idempotent-Replayed.
    entry.answered(res.status, res.statusText, res.headers.get("Idempotent-Replayed"));
    return res;
  } catch (e) {
    entry.failed("no-response", ctrl.signal.aborted ? "Timed out" : "No response");
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

let count = 0;

// logRequest adds a row for a request on its way, and returns the means to
// fill it in when it ends. The row's data attributes say the same for the
// page's tests.
function logRequest(method, path, key) {
  log.querySelector(".empty")?.remove();
  const tr = document.createElement("tr");
  tr.className = "fresh";
  Object.assign(tr.dataset, { method, path, key: key || "", status: "pending", replayed: "" });
  tr.append(
    cell("col-n", `${++count}`),
    cell("col-request", chip("method method-" + method.toLowerCase(), method), pathSpan(path)),
    cell("col-key", key ? keyChip(key) : dash()),
    cell("col-status", chip("badge badge-muted", "…")),
    cell("col-replayed", dash()),
  );
  log.append(tr);
  const wrap = log.closest(".log-wrap");
  wrap.scrollTop = wrap.scrollHeight; // the latest in view, without moving the page
  const [, req, , status, replayed] = tr.children;
  return {
    note(text) {
      req.append(span("note-chip", text));
    },
    answered(code, text, replayedHeader) {
      tr.dataset.status = String(code);
      tr.dataset.replayed = replayedHeader || "";
      const kind = code < 300 ? "ok" : code < 500 && code !== 409 && code !== 429 ? "warn" : "bad";
      status.replaceChildren(chip("badge badge-" + kind, `${code} ${text}`.trim()));
      replayed.replaceChildren(replayedHeader ? chip("badge badge-replayed", replayedHeader) : dash());
      if (replayedHeader) {
        replayed.title = "Answered from the record of the first request: nothing ran twice.";
      }
    },
    failed(kind, text) {
      tr.dataset.status = kind;
      status.replaceChildren(chip("badge " + (kind === "offline" ? "badge-muted" : "badge-bad"), text));
    },
  };
}

function cell(className, ...children) {
  const td = document.createElement("td");
  td.className = className;
  td.append(...children);
  return td;
}

function span(className, text) {
  const s = document.createElement("span");
  s.className = className;
  s.textContent = text;
  return s;
}

const chip = span;

function dash() {
  const s = span("dash", "—");
  s.title = "none";
  return s;
}

// shortPath elides the long values of a path's query (keys, mostly).
function shortPath(path) {
  return path.replace(/=[^&]{9,}/g, "=…");
}

// pathSpan shows a path, with a place to break the line before its query.
function pathSpan(path) {
  const short = shortPath(path);
  const q = short.indexOf("?");
  const s = span("path", q < 0 ? short : short.slice(0, q));
  if (q >= 0) s.append(document.createElement("wbr"), short.slice(q));
  s.title = path;
  return s;
}

// keyChip shows the start of a key, in a colour of its own, so that the
// same key sent twice is seen at a glance.
function keyChip(key) {
  const s = span("key", key.length > 10 ? key.slice(0, 8) + "…" : key);
  s.title = key;
  let hue = 0;
  for (const c of key) hue = (hue * 31 + c.charCodeAt(0)) % 360;
  s.style.setProperty("--hue", String(hue));
  return s;
}
